"""A turn's prompt ids: the session's conversation through the model's chat template, or raw text."""
from __future__ import annotations

import logging

from ..model.chat_prompt import ChatPrompt
from ..model.tokenizer import Tokenizer
from .request import Request
from .session import Session, common_prefix_length

log = logging.getLogger(__name__)
_PROBE_TEXTS = ("a", "Z", "7", "?", "\u4e2d")     # user texts that share no first token


class PromptBuilder:
    def __init__(self, chat_prompt: ChatPrompt, tokenizer: Tokenizer, max_context: int, drop_oldest: bool):
        self.chat_prompt = chat_prompt
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.drop_oldest = drop_oldest

    def prefix(self, system_prompt: str) -> list:
        """What every first turn with this system prompt starts with (what sessions share): the system
        turn alone, or, for a template with no system role (Gemma: the system text opens the first
        user turn), the ids that first turns with different user texts have in common."""
        system = {"role": "system", "content": system_prompt}
        alone = self.chat_prompt.ids([system], add_generation_prompt=False)
        firsts = [self.chat_prompt.ids([system, {"role": "user", "content": probe}], add_generation_prompt=True)
                  for probe in _PROBE_TEXTS]
        common = firsts[0]
        for ids in firsts[1:]:
            common = common[:common_prefix_length(common, ids)]
        rendered_alone = system_prompt.strip() in self.chat_prompt.text([system], add_generation_prompt=False)
        return alone if rendered_alone and common[:len(alone)] == alone else common

    def turn(self, session: Session, text: str, role: str = "user") -> list:
        messages = list(session.messages) + [{"role": role, "content": text}]
        if session.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": session.system_prompt})
        return self.chat_prompt.ids(messages, add_generation_prompt=True)

    def build(self, request: Request, session: Session, history: list) -> list:
        """request's prompt; history: the ids the session's KV holds (raw requests continue them)."""
        if request.raw:                      # the text as is, control tokens parsed (CLI only)
            bos = [self.tokenizer.bos_id] if not history and self.tokenizer.add_bos_default else []
            return history + bos + self.tokenizer.encode(request.text)
        ids = self.turn(session, request.text, request.role)
        if self.drop_oldest:
            ids = self._drop_oldest_turns(request, session, ids)
        return ids

    def _drop_oldest_turns(self, request: Request, session: Session, ids: list) -> list:
        """context_overflow=drop_oldest: forget the oldest (user, assistant) turns after the system
        prompt until the new turn fits with room for its answer; the KV after the system prompt
        is then recomputed (its blocks no longer match)."""
        room = min(request.params.max_new_tokens, self.max_context // 4)
        dropped = 0
        while len(ids) + room > self.max_context and len(session.messages) >= 2:
            del session.messages[:2]
            dropped += 1
            ids = self.turn(session, request.text, request.role)
        if dropped:
            log.info("session %r: dropped its %d oldest turn(s) to fit max_context_tokens=%d (context_overflow="
                     "drop_oldest); prompt now %d tokens", session.session_id, dropped, self.max_context, len(ids))
        return ids
