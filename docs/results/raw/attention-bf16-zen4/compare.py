import sys, torch, json
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
la, lb = torch.log_softmax(a["logits"].float(), -1), torch.log_softmax(b["logits"].float(), -1)
agree = (la.argmax(-1) == lb.argmax(-1)).float()
kl = (la.exp() * (la - lb)).sum(-1)
N = len(agree)
print(json.dumps({"a": a["precision"], "b": b["precision"], "n": N, "top1_agree": round(agree.mean().item(), 4),
  "agree_last_quarter": round(agree[3*N//4:].mean().item(), 4), "kl_mean": round(kl.mean().item(), 5),
  "kl_p99": round(kl.quantile(0.99).item(), 4)}))
