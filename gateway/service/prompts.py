"""The prompts of embedding models: text prepended to every input as the model was trained (sentence-transformers'
`prompts`), chosen by name or by an API's input type."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import ErrorType, invalid
from gateway.service.registry import ServedModel

# OpenAI-style `input_type` (NVIDIA's embedding NIM) -> the prompt names a model may call it by.
INPUT_TYPE_PROMPTS: dict[str, tuple[str, ...]] = {
    "query": ("query",),
    "passage": ("passage", "document", "doc"),
}
# Cohere's input_type -> the prompt names a model may call it by, in order of preference.
COHERE_INPUT_TYPE_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage", "doc"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


def prompt_text(model: ServedModel, prompt_name: str | None) -> str:
    """The prefix of `prompt_name`, else of the model's default prompt, else ""; 400 for an unknown name."""
    name = prompt_name if prompt_name is not None else model.default_prompt
    if not name:
        return ""
    if name not in model.prompts:
        known = ", ".join(sorted(model.prompts)) or "none"
        raise invalid(f"model {model.name!r} has no prompt {name!r} (its prompts: {known})", type=ErrorType.UNKNOWN_PROMPT)
    return model.prompts[name]


def prompt_for_input_type(model: ServedModel, input_type: str | None) -> str | None:
    """The prompt name an `input_type` maps to; None (the default prompt) when not given or when the
    model has no prompts at all (a symmetric model); 400 when the model has prompts but none for it."""
    if input_type is None or not model.prompts:
        return None
    for name in INPUT_TYPE_PROMPTS[input_type]:
        if name in model.prompts:
            return name
    raise invalid(f"model {model.name!r} has no prompt for input_type {input_type!r} "
                  f"(its prompts: {', '.join(sorted(model.prompts))})", type=ErrorType.UNKNOWN_PROMPT)


def with_prompt(texts: list[str], prefix: str) -> list[str]:
    return [prefix + t for t in texts] if prefix else texts


def input_type_prompt(model: ServedModel, input_type: str | None) -> str:
    """Cohere's rule: the prefix of the model's prompt for `input_type`, else its default prompt (if any)."""
    for name in COHERE_INPUT_TYPE_PROMPTS.get(input_type or "", ()):
        if name in model.prompts:
            return model.prompts[name]
    return prompt_text(model, None)


@dataclass(frozen=True, slots=True)
class Prompt:
    """Which of the model's prompts goes before every text: `name` (None: the model's default prompt), or the
    prompt of an `input_type`, by NVIDIA NIM's rule (`query`, `passage`: 400 when the model has prompts but none
    for it) or, with `cohere`, by Cohere's (`search_query`, ...: the default prompt when the model has none)."""

    name: str | None = None
    input_type: str | None = None
    cohere: bool = False

    def prefix(self, model: ServedModel) -> str:
        if self.cohere:
            return input_type_prompt(model, self.input_type)
        name = self.name if self.input_type is None else prompt_for_input_type(model, self.input_type)
        return prompt_text(model, name)


DEFAULT_PROMPT = Prompt()
