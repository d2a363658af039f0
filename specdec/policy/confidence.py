"""The confidence rule, and the target's confidence as a signal on plain steps (mixins of AdaptivePolicy).

Confidence rule (chains of a drafter that knows its confidence: a draft model, a hybrid's model
steps; in a server's round at the round's batch, priced as choose() prices it): once choose() says
draft, the drafter may go up to k_cap, and before each token asks the rule from
confident_draft() with the top probability p of its distribution there. a(p),
per bin of p, is the chance such a token passes given the chain reached it; n(p) the chance that,
after a passing token of that confidence, the next look passes too (Beta estimates with prior mean
p, kept across requests). With R the chance the chain got this far and r the rate choose()
predicted (for a probe: plain decoding's, with the margin; a confident draft then probes with a
chain, a doubtful one not at all): the token (its draft forward spent) is drafted if R a(p) beats r times the verify time it
adds, and the drafter goes on after it if the further tokens (n(p) each; a draft forward and a
verify position each) add more than r times their time. A chain the rule ended after all its
tokens passed counts a failure at the next position, and one ended before its first token is a
failed look, not a plain step: the position estimates then measure what looking yields.

The target's confidence (observe_target): a plain step still shows something, the target's top
probability at the token it chose, and where the target is sure a same-family draft tends to
match it. Drafted steps calibrate target_rate(p) per bin of that probability (a looked-at row
passed or not); a plain step's calibrated rate counts as shadow_weight of an observation in the
pooled rate (it fades by decay per drafted step, as real outcomes come) and in the request's
record that moves the carried prior. So a request running plain (unadmitted, backed off, or
after failed probes) starts the drafter or resumes drafting on its own text's evidence, and the
carried prior learns from requests that never drafted (else a few failed allowance requests can
leave code prompts plain from end to end)."""

from __future__ import annotations

from typing import Callable

from specdec.drafters.base import END, GO_ON, LAST
from specdec.policy.estimates import Bins


class ConfidenceRule:
    """Calibration bins kept across requests (they describe the draft/target pair more than the text):
    per bin of the draft's top probability, whether a drafted token there passed given the chain
    reached it (`conf_bins`), and, after a passing token, whether the look at the next position passed
    (`next_bins`: text the draft is sure of tends to go on being easy); per bin of the target's top
    probability at a looked-at position, whether the look passed (`target_bins`, for observe_target)."""

    def _start_confidence(self) -> None:
        self.conf_bins, self.next_bins, self.target_bins = Bins(), Bins(), Bins()
        self.last_looked = 0  # draft forwards the last step ran (drafted tokens + a look that stopped)

    def _reset_confidence(self) -> None:
        self.step_conf: list[float] = []  # this step's drafted tokens' confidences (under the rule)
        self.step_stopped = False  # this step's chain was ended by the confidence rule

    def confidence_rate(self, p: float) -> float:
        """The chance a drafted token whose draft probability was p passes, given the chain reached it:
        a Beta estimate per confidence bin, whose prior mean is the bin's confidence (a calibrated draft)."""
        return self.conf_bins.rate(p, self.cfg.conf_weight)

    def next_rate(self, p: float) -> float:
        """The chance that, after a passing token of draft probability p, looking at the next position
        yields a passing token (a Beta estimate per bin; prior mean: the bin's confidence)."""
        return self.next_bins.rate(p, self.cfg.conf_weight)

    def target_rate(self, p: float) -> float:
        """The chance a look at a position where the target's top probability is p passes (a Beta
        estimate per bin, prior mean the bin's confidence), learned from drafted steps."""
        return self.target_bins.rate(p, self.cfg.conf_weight)

    def observe_target(self, confidence, num_drafted: int, num_accepted: int) -> None:
        """The target's top probability at each verified row of a step (rows 0..num_drafted); call
        before observe(). A step that looked: its looked-at rows calibrate target_rate (a row passed
        if its token was accepted), and the plain steps' predictions fade as real outcomes come. A
        plain step: its row's calibrated rate counts as a predicted acceptance in the pooled rate.

        This is the per-request signal a plain request lacks: the carried prior says how the last
        requests drafted, the target's confidence on this one's own tokens how this one would (code
        the target is sure of: high; open prose: low). A request that runs plain (not admitted, or
        after failed probes) can so start or resume drafting from what its text shows, and a
        few poor requests cannot lock drafting out of the next, different ones."""
        if not self.cfg.target_signal or not confidence:
            return
        looked = self._looked(num_drafted, num_accepted)
        if looked == 0:
            self._predict(confidence[0])
            return
        for j, p in enumerate(confidence[:min(looked, num_accepted + 1)]):
            self.target_bins.count(p, j < num_accepted, 1.0 - self.cfg.conf_decay)
        self.shadow.fade(1.0 - self.cfg.decay)

    def observe_waiting(self, outcome) -> None:
        """A step drafted by prompt lookup while this policy's drafter waits to start (its outcome is
        the waiting policy's to learn from): its tokens count toward the answer's length, and the
        target's confidence at each emitted row (the lookup's passed tokens and the token after them)
        predicts this drafter's acceptance there, as on a plain step. The start (start_now) so rests
        on the same evidence, token for token, as when the waiting steps run plain."""
        o = outcome
        self.request_tokens += o.num_accepted + 1 + o.free_accepted
        if not self.cfg.target_signal or not o.confidence:
            return
        for p in o.confidence[:o.num_accepted + 1]:
            self._predict(p)

    def _predict(self, p: float) -> None:
        """A token this drafter did not draft, where the target's top probability was p: its calibrated
        rate counts as a predicted acceptance in the pooled rate and the request's record."""
        a = self.target_rate(p)
        self.shadow.add(a, 1.0, 1.0 - self.cfg.shadow_decay)
        self.request_shadow.add(a)

    def _looked(self, num_drafted: int, num_accepted: int) -> int:
        """Positions this step looked at: its drafted tokens, and one more where the confidence rule
        ended a chain whose tokens all passed (a failed look)."""
        return num_drafted + int(self.step_stopped and num_accepted == num_drafted)

    def confident_draft(self, k: int, k_cap: int, batch: int = 1) -> tuple[int, Callable[[int, float], int] | None]:
        """After choose(batch) returned k for a chain: (the most tokens to draft, the rule) for a drafter
        that knows its confidence (DraftState.stop). Where choose() drafts (by estimate, or a probe: then
        against plain decoding's rate) and the rule is on, the drafter may go up to k_cap, the rule
        deciding each token; else (k, None).

        In a round of `batch` rows the times are the round's, as choose() prices them (every row alike):
        a draft position is one pooled forward over the rows, c d(batch), and n drafted tokens a row
        verify batch (n + 1) positions. choose()'s rate is a row's tokens per round time, so each row
        weighs its tokens against the time its drafting adds to the round every row waits on."""
        if not self.cfg.confidence or k == 0 or self.rate <= 0 or self.cfg.schedule:
            return k, None
        self.step_conf, self.step_stopped, reach = [], False, [1.0]
        rate, c = self.rate, self.draft_cost * self.costs.d(batch)

        def V(n: int) -> float:  # the round's verify time with n drafted tokens a row
            return self.rho_v * self.costs.v(batch) if n == 0 else self.rho_spec * self.costs.v(batch * (n + 1))

        def stop(i: int, p: float) -> int:
            """Token i + 1, of draft probability p (its draft forward is spent): worth drafting if the
            tokens it adds beat the predicted rate x the verify time it adds; worth going on after it
            if the further tokens (each passing at next_rate(p), each a draft forward and a verify
            position) add more than rate x their time."""
            a, b = self.confidence_rate(p), self.next_rate(p)
            r = reach[0] * a
            here = r - rate * (V(i + 1) - V(i))
            value = after = 0.0
            for j in range(i + 1, k_cap):
                r *= b
                value += r - rate * (c + V(j + 1) - V(j))
                after = max(after, value)
            if here + after <= 0:
                self.step_stopped = True
                return END
            reach[0] *= a
            self.step_conf.append(p)
            return GO_ON if after > 0 else LAST

        return max(k, k_cap), stop

    def _count_confidence(self, num_drafted: int, num_accepted: int, looked: int) -> None:
        """The drafted tokens' outcomes into the confidence bins: each passed or failed at its draft
        probability, and after a passing one, whether the next look passed."""
        keep = 1.0 - self.cfg.conf_decay
        for j, p in enumerate(self.step_conf[:num_drafted][:num_accepted + 1]):
            self.conf_bins.count(p, j < num_accepted, keep)
            if j < num_accepted and j + 1 < looked:  # it passed, and the next position was looked at
                self.next_bins.count(p, j + 1 < num_accepted, keep)
