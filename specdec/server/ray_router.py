"""Conversation-aware routing for the specdec replicas (a Ray Serve request router).

A request carries its conversation's key (`conversation=`, see ray_serve.conversation_key). The
replica that served the conversation before ranks first; Ray Serve takes it only while its queue
is under the replica's max_ongoing_requests (its free slots), else the next rank: every other
replica, the one with the fewest ongoing requests first. A new conversation goes to the least
loaded replica (ties: the one home to the fewest conversations). Routed conversations are remembered (least recently routed forgotten first).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import List, Optional

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

REMEMBERED = 100_000


class ConversationRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, **kwargs):
        self.homes: OrderedDict[str, object] = OrderedDict()  # conversation -> replica id
        self.sticky_hits = self.routed = 0

    @staticmethod
    def _key(pending_request: Optional[PendingRequest]) -> str | None:
        if pending_request is None:
            return None
        key = pending_request.kwargs.get("conversation")
        return key if isinstance(key, str) else None

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        home = self.homes.get(self._key(pending_request))
        first = [r for r in candidate_replicas if r.replica_id == home]
        rest = [r for r in candidate_replicas if r.replica_id != home]
        if first:
            return [first, rest]
        # a new conversation: the least loaded replica (queue lengths as last probed), ties to the one that
        # is home to the fewest conversations, so conversations spread and their caches do not crowd one slot set
        homed = Counter(self.homes.values())
        ranked = sorted(rest, key=lambda r: (self._replica_queue_len_cache.get(r.replica_id) or 0, homed[r.replica_id]))
        return [ranked[:1], ranked[1:]] if ranked else []

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        key = self._key(pending_request)
        if key is None:
            return
        self.routed += 1
        self.sticky_hits += int(self.homes.get(key) == replica_id)
        self.homes[key] = replica_id
        self.homes.move_to_end(key)
        while len(self.homes) > REMEMBERED:
            self.homes.popitem(last=False)
