"""A chat template with tools for models whose own template has none (tiny test models).

Real tool-calling models bring their own template (Qwen2.5/3, Hermes, Llama 3.1, Mistral); the
``tool-use`` harness renders through whatever the tokenizer holds. This one follows the Hermes
layout (the tool schemas in the system turn, calls in ``<tool_call>`` tags, results in
``<tool_response>`` tags inside a user turn) with ChatML markers, so a tiny model made by
:func:`leanrl.testing.make_tiny_model` (whose tokenizer knows ``<|im_start|>``/``<|im_end|>``)
can be offered tools: set ``tokenizer.chat_template = HERMES_TOOL_TEMPLATE`` and save it.

Transformers renders templates with ``trim_blocks`` (a newline right after ``%}`` is dropped),
hence the ``{{ '\\n' }}`` where a line must start right after a tag.
"""

from __future__ import annotations

__all__ = ["HERMES_TOOL_TEMPLATE"]

HERMES_TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions. Their signatures are in <tools></tools>:\n"
    "<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n\n"
    "For each call, return a JSON object with the function name and arguments in "
    '<tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n"
    "{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and loop.first %}"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% elif m['role'] == 'assistant' %}<|im_start|>assistant\n{{ m['content'] or '' }}"
    "{% for tc in m.get('tool_calls') or [] %}{{ '\\n' }}<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Hermes-style tool template with ChatML markers (see the module docstring)."""
