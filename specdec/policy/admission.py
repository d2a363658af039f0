"""Admission of a drafter's prefill (a mixin of AdaptivePolicy).

Admission: a draft model must prefill the prompt before its first proposal (prefill_fixed +
prefill_cost per prompt token + prefill_quadratic per token squared, in plain steps: a fixed part,
since any prefill reads the draft's weights and a few rows run the slow small-M GEMMs, a part per
token, and attention's square, which doubles a 2k-token prompt's price; scaled by rho_prefill, the
measured over predicted seconds of earlier prefills, which a price of the right shape keeps the same
for short and long prompts). The saving it buys is the predicted saving per token times the tokens still to come, and
how many come is unknown: after a long prompt a RAG answer runs to 20 tokens, a summary to hundreds.
The engine and the server rent before they buy (start_now, a ski rental): it starts the draft
model with the prompt only when the prefill costs at most commit_share (1/4) of the saving predicted
over the expected answer (max_new_tokens, or less: the running mean length of earlier answers,
expected_new); otherwise it decodes plain, or drafts by lookup under the waiting policy (`--draft`
of the target's tokenizer, the hybrid), and starts the draft model, prefilling the prompt and the
answer so far, once the tokens so far have lost as much as the prefill costs (at the saving per token
predicted over plain decoding) and the tokens left under max_new_tokens could still win it back. A short answer then never
pays the prefill, a long one pays it at most twice. In the server a draft prefill stalls the whole
batch, so there both terms are taken at the round's batch size. A prefill within a
small learning allowance (the fixed part of a prefill plus 5% of the expected answer's length in plain
steps: a short prompt) is admitted at the start
whatever the prediction (only drafting shows whether this text suits the drafter; without it a low
carried prior would never be tested again), backed off like probes: after a request admitted
on it alone whose drafts did not pay, the next 1, 2, 4, ... (at most learn_backoff_max) requests skip
it; one that pays restores it. In a batch of B the prefill stalls all B sequences, so it counts B
times, against the saving at batch B."""

from __future__ import annotations


class Admission:
    """Whether a request's drafter prefills (admit, start_now), with the learning allowance backed
    off like probes and the expected answer length learned over requests."""

    def _start_admission(self) -> None:
        self.learning = False  # this request was admitted on the learning allowance alone
        self.learn_backoff = self.learn_skip = 0  # requests the allowance skips after one that did not pay
        self.expected_new: float | None = None  # new tokens per request (EMA over requests; None: none seen)
        self.request_tokens = 0  # tokens this request's steps emitted

    def _end_admission(self) -> None:
        """A request ended: its length moves the expected answer length, and if it was admitted only to
        learn, whether its drafts turned out to pay sets the allowance's back-off."""
        if self.request_tokens > 0:  # (+ 1: the prefill's token)
            n = self.request_tokens + 1
            e = self.expected_new
            self.expected_new = float(n) if e is None else e + self.cfg.length_memory * (n - e)
        self.request_tokens = 0
        if self.learning:
            pays = self._best_k([self.request.rate()] * self.cfg.k_max, self.cfg.k_max)[0] > 0
            self.learn_backoff = 0 if pays else min(2 * self.learn_backoff or 1, self.cfg.learn_backoff_max)
            self.learn_skip = self.learn_backoff
        self.learning = False
        self.last_admission: dict | None = None  # admit()'s terms and word for this request (for the stats)

    def _prefill_terms(self, prefill_len: int, max_new_tokens: int, batch: int) -> tuple[float, float, float]:
        """(the drafter's prefill of prefill_len tokens, the saving predicted per new token, the expected
        answer length), times in plain steps: the prefill priced by the profile and scaled by the
        measured prefills (counted `batch` times: it stalls every running sequence), the saving at
        the best k's predicted rate (none above the critical batch), the length min(max_new_tokens,
        the running mean length of earlier answers)."""
        batch = max(batch, 1)
        cost = self.costs.prefill(prefill_len) * self.rho_prefill * batch
        _, rate = self._best_k(self.beta, self.cfg.k_max, batch)
        plain = 1.0 / (self.rho_v * self.costs.v(batch))  # per-sequence plain rate at this batch
        per_token = 1.0 / plain - 1.0 / rate if rate > plain else 0.0
        horizon = max_new_tokens if self.expected_new is None else min(max_new_tokens, self.expected_new)
        return cost, per_token, horizon

    def admit(self, prompt_len: int, max_new_tokens: int, batch: int = 1, share: float = 1.0) -> bool:
        """Whether this request should use the drafter at all, decided once at its start (callers
        that cannot start it later; the engine and the server ask start_now): its prefill of the prompt must cost at
        most `share` of the saving predicted over the expected answer, or fit the learning allowance.
        A 900-token RAG prompt whose answers run to 20 tokens cannot win its draft prefill back,
        whatever max_new_tokens allows.

        In a batch of B running sequences the draft's prefill stalls all of them, so it counts B
        times, against the saving predicted at that batch size (none above the critical batch)."""
        if not self.costs.charges_prefill or self.cfg.schedule:
            return True
        cost, per_token, horizon = self._prefill_terms(prompt_len, max_new_tokens, batch)
        # what the decision rests on, for the request's stats (a refusal can then be checked)
        self.last_admission = {"prefill_cost": round(cost, 3), "saving_per_token": round(per_token, 4),
                               "horizon": round(horizon, 1), "share": share, "prior": round(self.prior, 3),
                               "rho_prefill": round(self.rho_prefill, 3), "rho_v": round(self.rho_v, 3),
                               "rho_spec": round(self.rho_spec, 3), "draft_cost": round(self.draft_cost, 3),
                               "learn_skip": self.learn_skip}
        word = self._admit(cost, per_token, horizon, max_new_tokens, batch, share)
        self.last_admission["admitted"] = word
        return word

    def _admit(self, cost: float, per_token: float, horizon: float, max_new_tokens: int, batch: int,
               share: float) -> bool:
        if cost <= share * per_token * horizon:
            return True
        # the allowance bounds the prefill's part per token by a share of the answer expected (not of
        # max_new_tokens: a 512-token budget would let a 700-token RAG prompt whose answers run to 20
        # tokens prefill every time); its fixed part is the price of any look (priced as the calibration
        # says), however short the prompt
        allowance = self.costs.prefill_fixed * self.rho_prefill + self.cfg.learn_budget * horizon
        if batch > 1 or cost > allowance:
            return False
        # The learning allowance, backed off like probes: after an allowance request whose drafts did
        # not pay, the next 1, 2, 4, ... requests skip it. Each still-admitted one can bring drafting
        # back (a refused request shows nothing, so the allowance is never switched off for good).
        if self.learn_skip > 0:
            self.learn_skip -= 1
            return False
        self.learning = True
        return True

    def start_now(self, prefill_len: int, generated: int, max_new_tokens: int, batch: int = 1) -> bool:
        """Whether the drafter should prefill the text so far (prefill_len of its tokens) and start
        drafting now. Asked at the request's start (generated = 0) and, until it says yes, before
        each step, which runs plain meanwhile. In a batch of B decoding sequences (the server) the
        prefill stalls all of them and the saving is the one predicted at that batch size, as in
        admit. A ski rental:
        - at the start, only when the prefill costs at most commit_share of the saving predicted over
          the expected answer, or fits the learning allowance (as admit: a short prompt's prefill is
          cheap, and only drafting shows whether this text suits the drafter): a short answer then
          loses little, a long one wins almost all;
        - later, once the plain steps so far have lost as much as the prefill costs (generated times
          the saving per token), and the tokens left under max_new_tokens could still win it back.
        An answer that ends before that never pays for the prefill; one that runs on pays at most the
        prefill twice. The answer length after a long prompt (RAG: 20 tokens; a summary: hundreds)
        cannot be told from the prompt, and the running mean of earlier answers mixes the two."""
        if not self.costs.charges_prefill or self.cfg.schedule:
            return True
        if generated == 0:
            return self.admit(prefill_len, max_new_tokens, batch, share=self.cfg.commit_share)
        cost, per_token, _ = self._prefill_terms(prefill_len, max_new_tokens, batch)
        left = max_new_tokens - generated
        return per_token > 0 and cost <= per_token * min(generated, left)

