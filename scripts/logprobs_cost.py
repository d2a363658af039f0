"""Does asking for logprobs cost speed or drafting? The same chat requests through `specdec serve` (the Qwen pair,
the defaults) with and without `logprobs: true, top_logprobs: 5`, alternating, greedy, 96 tokens: tok/s, drafted and
accepted tokens (usage.speculative), and whether the texts are equal. Run from the repository root:

    python scripts/logprobs_cost.py     # writes runs/logprobs-cost.json
"""
import json, subprocess, sys, time, httpx, statistics, socket
s=socket.socket(); s.bind(("127.0.0.1",0)); port=s.getsockname()[1]; s.close()
base=f"http://127.0.0.1:{port}"
proc=subprocess.Popen([sys.executable,"-m","specdec.cli","serve","--model","qwen2.5-coder-1.5b-instruct","--draft","qwen2.5-coder-0.5b-instruct","--port",str(port),"--max-context","2048"],stdout=open("runs/lp-server.log","w"),stderr=subprocess.STDOUT)
while True:
    try:
        if httpx.get(base+"/health",timeout=2).status_code==200: break
    except Exception: pass
    time.sleep(1)
prompts=[json.loads(l)["prompt"] if "prompt" in json.loads(l) else json.loads(l)["turns"][0] for l in open("specdec/data/code_prompts.jsonl")][:6]
res={"plain":[],"logprobs":[]}
def one(p, lp):
    body={"model":"qwen2.5-coder-1.5b-instruct","messages":[{"role":"user","content":p}],"max_tokens":96,"temperature":0}
    if lp: body.update(logprobs=True, top_logprobs=5)
    t=time.perf_counter(); r=httpx.post(base+"/v1/chat/completions",json=body,timeout=600).json(); dt=time.perf_counter()-t
    u=r["usage"]; return {"tokens":u["completion_tokens"],"seconds":dt,"spec":u["speculative"],"text":r["choices"][0]["message"]["content"]}
one(prompts[0],False)
for i,p in enumerate(prompts):
    order=[False,True] if i%2==0 else [True,False]
    for lp in order: res["logprobs" if lp else "plain"].append(one(p,lp))
proc.terminate(); proc.wait()
out={}
for k,v in res.items():
    out[k]={"tok_s":round(sum(x["tokens"] for x in v)/sum(x["seconds"] for x in v),2),
            "drafted":sum(x["spec"]["drafted"] for x in v),"accepted":sum(x["spec"]["accepted"] for x in v)}
    out[k]["alpha"]=round(out[k]["accepted"]/max(1,out[k]["drafted"]),3)
out["same_text"]=sum(a["text"]==b["text"] for a,b in zip(res["plain"],res["logprobs"]))
out["ratio_tok_s"]=round(out["logprobs"]["tok_s"]/out["plain"]["tok_s"],3)
print(json.dumps(out,indent=1)); json.dump({"results":out,"runs":res},open("runs/logprobs-cost.json","w"),indent=1)
