"""Token-id contexts for multi-turn episodes.

Re-tokenizing a growing text context each turn does not give back the ids the model produced
(a completion's ids decode to text that encodes differently; chat templates re-render), so the
ids a trainer replays would differ from what the model conditioned on. When the policy can
generate from ids (:meth:`leanrl.Policy.generate_from_ids`), an episode's context after the
first turn is kept as ids instead: the first prompt's ids as the policy tokenized them, then per
turn the completion's ids and the feedback's ids, exactly the sequence
``Rollout.prompt_ids + Rollout.token_ids_and_mask()[0]`` that training replays.

The feedback's ids are what separates two model turns:

- completion formats: the feedback text, minus any part of it the completion's own tokens
  already hold (a completion stopped by the stop string ```` ``` ```` keeps the token that
  completed it, while its text and the text-path feedback assume it is absent);
- chat formats: the chat template's text between the end of an assistant message and the next
  assistant message (end of turn, the user message holding the feedback, the generation
  prompt), minus the end-of-turn token when the completion already ended with it.

Both need the policy's Hugging Face tokenizer (``policy.tokenizer``, as the ``hf`` and
``train-hf`` policies have); a policy without one uses text contexts.

:func:`record_turn` is what both multi-turn harnesses (``tactic-loop``, ``self-correction``) do
after each turn: append the Turn (model ids, feedback ids with mask 0) and grow the episode's
context, as ids or as text.
"""

from __future__ import annotations

from typing import Any, Protocol

from leanrl.policy import Completion, Policy, Prompt
from leanrl.rollout import ChatMessage, Turn

__all__ = ["Recording", "extend_context", "feedback_ids", "ids_capable", "record_turn"]

_MARK = "LEANRL-ASSISTANT-TURN-7f3a"  # stands for the assistant's text in a probe render


def ids_capable(policy: Policy, chat: bool) -> bool:
    """Whether episodes with this policy (and prompt kind) can grow their context as ids."""
    if type(policy).generate_from_ids is Policy.generate_from_ids:
        return False
    tok = getattr(policy, "tokenizer", None)
    if chat:
        return tok is not None and getattr(tok, "chat_template", None) is not None
    return True


def feedback_ids(policy: Policy, c: Completion, feedback: str, chat: bool) -> list[int]:
    """The ids that follow the completion ``c`` in an ids context (see the module doc)."""
    tok: Any = getattr(policy, "tokenizer", None)
    if chat:
        ids = policy.tokenize(_chat_separator(tok, feedback))
        # The model closed its turn itself: its last token is the end-of-turn token the
        # separator starts with. Compared as ids, and only for special tokens: a plain token
        # whose text merely starts the marker ("<" before "<|im_end|>") closes nothing.
        if ids and c.token_ids and ids[0] == c.token_ids[-1] and ids[0] in _special_ids(tok):
            ids = ids[1:]
        return ids
    if tok is not None and c.token_ids:
        decoded = str(tok.decode(list(c.token_ids), skip_special_tokens=True))
        extra = decoded[len(c.text) :] if decoded.startswith(c.text) else ""
        n = 0  # the start of the feedback that the completion's tokens already spell
        while n < min(len(extra), len(feedback)) and extra[n] == feedback[n]:
            n += 1
        feedback = feedback[n:]
    return policy.tokenize(feedback)


def _chat_separator(tok: Any, feedback: str) -> str:
    """The template's text from the end of an assistant message to the next generation prompt."""
    msgs = [
        {"role": "user", "content": "."},
        {"role": "assistant", "content": _MARK},
        {"role": "user", "content": feedback},
    ]
    text = str(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    return text[text.rindex(_MARK) + len(_MARK) :]


def _special_ids(tok: Any) -> set[int]:
    """Ids of the tokenizer's special tokens: the named ones and every added token marked
    special (chat markers such as ``<|im_end|>`` are often only the latter)."""
    ids = {int(i) for i in getattr(tok, "all_special_ids", ())}
    added = getattr(tok, "added_tokens_decoder", {}) or {}
    return ids | {int(i) for i, t in added.items() if getattr(t, "special", False)}


class Recording(Protocol):
    """What a multi-turn episode keeps of its turns (both harnesses' episodes have these)."""

    mode: str
    """``ids``: the context after the first turn is kept as token ids; ``text`` otherwise."""
    prompt_ids: list[int]
    """The first prompt's ids as the policy tokenized it."""
    ids: list[int]
    """The ids context (``mode == "ids"``): what the model conditions on next."""
    turns: list[Turn]
    """Every turn so far."""
    tokens: int
    """Model and environment tokens so far (the episode's budget)."""
    context: Prompt
    """The text context (a prompt or a message list) for policies that take text."""


def record_turn(ep: Recording, c: Completion, feedback: str, policy: Policy, chat: bool) -> None:
    """Append turn ``c`` and the environment's ``feedback`` ('' when the episode ends there) to
    ``ep``: its Turn, its token count, and its context for the next turn."""
    if not ep.turns:
        ep.prompt_ids = list(c.prompt_token_ids)
        if ep.mode == "ids" and not ep.prompt_ids:
            ep.mode = "text"  # the policy did not say what it conditioned on
        ep.ids = list(ep.prompt_ids)
    fb_ids: list[int] = []
    if ep.mode == "ids":
        fb_ids = feedback_ids(policy, c, feedback, chat) if feedback else []
        ep.ids += [*c.token_ids, *fb_ids]
    elif feedback:
        try:
            fb_ids = policy.tokenize(feedback)
        except NotImplementedError:
            pass  # a backend that cannot tokenize: the mask still holds for model tokens
    ep.turns.append(Turn.from_completion(c, feedback, fb_ids))
    ep.tokens += len(c.token_ids) + len(fb_ids)
    ep.context = extend_context(ep.context, c.text, feedback)


def extend_context(context: Prompt, completion: str, feedback: str) -> Prompt:
    """The text context after one more turn: a text prompt grows by the completion and the
    feedback; a message list by an assistant message and (with feedback) a user message."""
    if isinstance(context, str):
        return context + completion + feedback
    msgs = [*context, ChatMessage(role="assistant", content=completion)]
    if feedback:
        msgs.append(ChatMessage(role="user", content=feedback))
    return msgs
