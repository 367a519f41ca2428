"""og.MtpGenerator: multi-token-prediction (MTP) self-speculative decoding, onnxruntime-genai 0.18's API.

A checkpoint that declares MTP layers (Qwen3.5 / Qwen3.6: ``mtp_num_hidden_layers``) is exported by the builder with
a one-layer head, ``mtp.onnx``, beside the decoder, which then also gives its final hidden states (the ``mtp`` section
of genai_config.json, and model.decoder.outputs.hidden_states). The head takes the model's hidden state at position
``i`` and the token at ``i + 1`` and predicts the token at ``i + 2``:

    h'  = fc(concat(norm_e(embed(t[i + 1])), norm_h(h[i])));  logits = lm_head(norm(layer(h')))

Its KV cache holds the generated tokens only (the first pair is the prompt's last hidden state and the first
generated token). ``MtpGenerator(model, mtp_model, params)`` runs it as the proposer of the generator's speculative
rounds (crossml.genai.speculative): the head drafts ``max_draft_tokens`` tokens (speculative options; 4 by default),
chaining its own output hidden state after the first, and one decoder run verifies them. Each position's token is
chosen as a standard step chooses it, so the tokens are those of standard decoding (greedy and sampled alike). The
decoder's carried layer states (Qwen3.5's Gated DeltaNet layers) cannot be cut back: they are copied before a
verifying run and, when a draft is refused, put back, and the accepted tokens run again (onnxruntime-genai's
snapshot and replay). The head is loaded as its own ``og.Model`` from a folder whose genai_config.json names
mtp.onnx as its decoder, with a hidden_states input: ``head_folder`` writes one from the model's ``mtp`` section.
"""

from __future__ import annotations

import json
import os
import weakref
from typing import Any

import numpy as np
import torch

from crossml.genai import speculative
from crossml.genai.errors import GenAIError, GeneratorStateError, SearchOptionError
from crossml.genai.generator import Generator, GeneratorParams
from crossml.genai.model import Model

#: the head folder head_folder writes inside the model's folder
HEAD_FOLDER = "mtp_head"


def head_folder(folder: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None) -> str:
    """Write the folder of the MTP head of the model folder ``folder`` (whose genai_config.json has the builder's
    ``mtp`` section) at ``dest`` (default ``folder/mtp_head``): a genai_config.json whose decoder is the ``mtp``
    section (mtp.onnx, its inputs with hidden_states and outputs), the rest of the model's config, and links to the
    head's ONNX file and the external-data files it reads (the builder shares the embedding and lm_head through
    model.onnx.data). The result loads on crossml.genai and onnxruntime-genai alike. Returns the folder."""
    folder = os.fspath(folder)
    path = os.path.join(folder, "genai_config.json")
    with open(path) as f:
        config = json.load(f)
    model = config.get("model", {})
    mtp = model.pop("mtp", None)
    if not isinstance(mtp, dict) or not isinstance(mtp.get("filename"), str):
        raise GenAIError(f"'{path}': model.mtp is missing: the model was exported without a multi-token-prediction "
                         "head (the builder writes one, mtp.onnx, where the checkpoint declares mtp_num_hidden_layers)")
    dest = os.fspath(dest) if dest is not None else os.path.join(folder, HEAD_FOLDER)
    os.makedirs(dest, exist_ok=True)
    decoder = dict(model["decoder"])
    decoder.pop("shared_initializers", None)
    for key in ("filename", "num_hidden_layers", "num_key_value_heads", "head_size", "hidden_size",
                "num_attention_heads", "session_options"):
        if key in mtp:
            decoder[key] = mtp[key]
    decoder["inputs"], decoder["outputs"] = dict(mtp.get("inputs", {})), dict(mtp.get("outputs", {}))
    decoder.pop("layer_types", None)
    model["decoder"] = decoder
    with open(os.path.join(dest, "genai_config.json"), "w") as f:
        json.dump(config, f, indent=4)
    stem = mtp["filename"]
    for name in os.listdir(folder):
        if (name == stem or name.endswith((".data", ".onnx_data"))) and os.path.isfile(os.path.join(folder, name)):
            link = os.path.join(dest, name)
            if not os.path.lexists(link):
                os.symlink(os.path.relpath(os.path.join(folder, name), dest), link)
    return dest


class _Head:
    """The MTP head as a speculative proposer: its own greedy generator, whose sequence holds the generated tokens
    (the pairs (hidden state at i, token at i + 1) from the prompt's last position on), the model's hidden states per
    column (kept as each decoder run gives them), and the drafts of a round chained past the committed pairs."""

    def __init__(self, spec: speculative.Speculator, model: Model, prompt: int) -> None:
        self.spec = weakref.proxy(spec)
        g = spec.gen
        params = GeneratorParams(model)
        params.set_search_options(max_length=g._s.max_length, do_sample=False, min_length=0, repetition_penalty=1.0)
        self.gen = Generator(model, params, _speculate=False)
        self.gen._short_chunks = True  # its runs take one to K + 1 tokens: chunk buckets of their own width
        # the model's hidden states per column, as the head's input takes them
        self.hidden = torch.zeros((g._s.max_length, model.io.hidden_size), dtype=model.io.hidden_dtype, device=g._dev)
        self.first = prompt  # the first generated column
        self.pairs = 0  # pairs the head's KV cache holds for committed tokens
        self.chain = model.io.hidden_output  # the head's own hidden-state output, fed back for its next draft

    def record(self, end: int, hidden: torch.Tensor) -> None:
        """A decoder run's hidden states ([1, columns, hidden]) for the columns up to ``end``."""
        n = hidden.shape[1]
        self.hidden[end - n:end].copy_(hidden[0])

    def __call__(self, k: int) -> list[int]:
        spec, head = self.spec, self.gen
        g = spec.gen
        n = g._len
        new = n - self.first - self.pairs  # committed tokens not paired in the head yet
        if k <= 0 or new <= 0:
            return []
        head._cut(self.pairs)  # the last round's drafts
        start = self.first - 1 + self.pairs
        head.set_hidden_states(self.hidden[start:start + new].unsqueeze(0))
        tokens = g._seq[0, start + 1:n]  # the committed tokens, read where they are (no wait for the device)
        if self.pairs:
            head._append_device(tokens)
        else:  # the head's first run: its prompt
            head.append_tokens(tokens.cpu().numpy())
        self.pairs += new
        spec.c["draft_forward_passes"] += 1
        # the chain stays on the device: each draft feeds the next run, and the host reads them all once
        drafts = [head._logits.argmax(-1)]
        while len(drafts) < k:
            head.set_hidden_states(head._outputs[self.chain][:, -1:])
            head._append_device(drafts[-1])
            spec.c["draft_forward_passes"] += 1
            drafts.append(head._logits.argmax(-1))
        return torch.cat(drafts).tolist()


class MtpGenerator:
    """og.MtpGenerator(model, mtp_model, params): greedy or sampled generation of one sequence, drafted by the
    model's MTP head (``mtp_model``: the head's folder, ``head_folder``) and verified by the model. One token per
    ``generate_next_token``; ``append_tokens`` takes the prompt, once."""

    def __init__(self, model: Model, mtp_model: Model, params: GeneratorParams) -> None:
        s = params.search
        if s.batch_size != 1 or s.num_beams != 1 or s.num_return_sequences != 1:
            raise SearchOptionError("MtpGenerator supports only batch_size=1, num_beams=1, and num_return_sequences=1")
        if params.guidance is not None:
            raise SearchOptionError("MtpGenerator does not support guided generation")
        if model.device.type != mtp_model.device.type:
            raise GenAIError(f"MtpGenerator requires the main model and MTP head on the same device type (the model "
                             f"runs on {model.device.type}, the head on {mtp_model.device.type}); give both the same "
                             "providers")
        mc, hc = model.config.model, mtp_model.config.model
        if mc.vocab_size != hc.vocab_size:
            raise GenAIError(f"MtpGenerator requires matching main-model and MTP-head vocabulary sizes ({mc.vocab_size} "
                             f"and {hc.vocab_size}): is '{mtp_model.config.path}' this model's head?")
        if mc.decoder.hidden_size != hc.decoder.hidden_size:
            raise GenAIError(f"MtpGenerator requires matching main-model and MTP-head hidden sizes "
                             f"({mc.decoder.hidden_size} and {hc.decoder.hidden_size}, model.decoder.hidden_size)")
        out, into = model.io.hidden_output, mtp_model.io.hidden_input
        if out is None:
            raise GenAIError(f"The main decoder did not expose hidden states for its MTP head: "
                             f"'{model.config.path}' has no output named by model.decoder.outputs.hidden_states "
                             "(the builder adds it where the checkpoint has MTP layers: include_hidden_states=true)")
        if into is None:
            raise GenAIError(f"'{mtp_model.config.path}' is not an MTP head: its decoder has no input named by "
                             "model.decoder.inputs.hidden_states; make the head's folder with "
                             "crossml.genai.mtp.head_folder(model_folder)")
        if model.io.hidden_dtype != mtp_model.io.hidden_dtype:
            raise GenAIError("MtpGenerator requires matching hidden-state tensor types (the model's output "
                             f"'{out}', the head's input '{into}')")
        if mtp_model.io.state_names or mtp_model.window_layers:
            raise GenAIError(f"MtpGenerator: the head '{mtp_model.config.path}' must be a plain attention decoder, "
                             "without carried states or window-sized KV caches")
        why = speculative.cannot_verify(model, replays=True)
        if why:
            raise GenAIError(f"MtpGenerator: '{model.config.path}' cannot verify drafts: {why}")
        k = params.speculative.max_draft_tokens
        if k > 1 and mtp_model.io.hidden_output is None:
            raise GenAIError(f"MtpGenerator: max_draft_tokens={k} requires the configured MTP "
                             "feedback output (model.decoder.outputs.hidden_states of the head, hidden_states_out as "
                             "the builder exports it); set max_draft_tokens=1 with set_speculative_options")
        self._model, self._head_model, self._params = model, mtp_model, params
        self._start()

    def _start(self) -> None:
        self._gen = Generator(self._model, self._params, _speculate=False)
        options = speculative.SpeculativeOptions(max_draft_tokens=self._params.speculative.max_draft_tokens)
        self._spec = speculative.Speculator(self._gen, options, given=True)
        self._head: _Head | None = None
        self._prompt = 0

    def append_tokens(self, tokens: Any) -> None:
        """The prompt ([length] or [1, length]); once per sequence (``reset`` starts another)."""
        if self._prompt:
            raise GeneratorStateError("MtpGenerator: AppendTokens can only be called once (reset() starts a new "
                                      "sequence)")
        g = self._gen
        g.append_tokens(tokens)
        self._prompt = g._len
        self._head = _Head(self._spec, self._head_model, self._prompt)
        g._on_hidden = self._head.record
        self._head.record(g._len, g._outputs[self._model.io.hidden_output])
        self._spec.propose = self._head
        g._spec = self._spec

    def generate_next_token(self) -> None:
        """Hand out the next token: the first comes from the prompt's logits, the later ones from the rounds."""
        if not self._prompt:
            raise GeneratorStateError("MtpGenerator: AppendTokens must be called before GenerateNextToken")
        g = self._gen
        if g.is_done():
            return
        if g._len == self._prompt:
            g._standard_step()
        else:
            g.generate_next_token()

    def is_done(self) -> bool:
        return bool(self._prompt) and self._gen.is_done() and self._spec.round is None

    def get_sequence(self) -> np.ndarray:
        """The prompt and the tokens handed out so far (int32)."""
        return self._gen.get_sequence(0)

    def get_stats(self) -> dict[str, Any]:
        """onnxruntime-genai's speculative counters (Generator.get_speculative_stats' keys), and its aliases
        ``forwards`` (target_forward_passes: verifying runs and replays), ``accepts`` (draft_tokens_accepted) and
        ``trials`` (draft_tokens_evaluated)."""
        out = self._spec.stats()
        out["forwards"] = out["target_forward_passes"]
        out["accepts"] = out["draft_tokens_accepted"]
        out["trials"] = out["draft_tokens_evaluated"]
        return out

    def reset(self) -> None:
        """Start a new sequence (the next append_tokens is its prompt); the counters start again."""
        self._start()
