"""Token selection on the device: logits processors, greedy, sampling and beam search.

Everything here works on [rows, vocab] tensors on the model's device and returns device tensors:
no ``.item()`` / host copies, so a decode step never waits for the device. Sampling draws with the
exponential-race trick (``argmax(p / Exp(1))``), which needs no host sync, from a seeded
``torch.Generator``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


# -- logits processors ------------------------------------------------------------------------
def apply_repetition_penalty(scores: torch.Tensor, sequences: torch.Tensor, penalty: float) -> torch.Tensor:
    """Tokens already in a row's sequence: positive scores / penalty, negative ones * penalty."""
    if penalty == 1.0 or sequences.shape[1] == 0:
        return scores
    seen = scores.gather(1, sequences)
    scores = scores.clone()
    scores.scatter_(1, sequences, torch.where(seen < 0, seen * penalty, seen / penalty))
    return scores


def apply_min_length(scores: torch.Tensor, length: int, min_length: int, eos: torch.Tensor) -> torch.Tensor:
    """Forbid the end-of-sequence tokens while the sequences are shorter than ``min_length``."""
    if length >= min_length:
        return scores
    return scores.index_fill(1, eos, NEG_INF)  # no host value to copy to the device (no sync)


def apply_no_repeat_ngram(scores: torch.Tensor, sequences: torch.Tensor, n: int) -> torch.Tensor:
    """Forbid tokens that would repeat an n-gram already in the row (reads the sequences on the host)."""
    if n <= 0 or sequences.shape[1] < n:
        return scores
    scores = scores.clone()
    rows = sequences.tolist()
    for r, seq in enumerate(rows):
        prefix = tuple(seq[len(seq) - n + 1:]) if n > 1 else ()
        banned = {seq[i + n - 1] for i in range(len(seq) - n + 1) if tuple(seq[i:i + n - 1]) == prefix}
        if banned:
            scores[r, list(banned)] = NEG_INF
    return scores


# -- selection --------------------------------------------------------------------------------
def greedy(scores: torch.Tensor) -> torch.Tensor:
    return scores.argmax(dim=-1)


# -- bookkeeping of a chosen token ------------------------------------------------------------------
def finish(token: torch.Tensor, done: torch.Tensor, pad: int, eos: torch.Tensor) -> torch.Tensor:
    """The tokens to append: ``pad`` for rows already finished; marks in ``done`` (in place) the rows whose
    token is an end-of-sequence id."""
    token = torch.where(done, torch.full_like(token, pad), token)
    done |= torch.isin(token, eos)
    return token


def position_of(mask: torch.Tensor, col: int) -> torch.Tensor:
    """[rows, 1] position ids of the tokens in column ``col`` of a [rows, columns] attention mask: the real
    tokens up to and including it, minus one (0 for a row with none)."""
    return (mask[:, :col + 1].sum(-1, keepdim=True, dtype=torch.long) - 1).clamp_min(0)


def sample(scores: torch.Tensor, *, top_k: int, top_p: float, temperature: float,
           generator: torch.Generator | None) -> torch.Tensor:
    """Sample one token per row from softmax(scores / temperature) restricted to top-k, then top-p."""
    if top_k == 1:
        return greedy(scores)
    scores = scores.float() / max(temperature, 1e-6)
    if 0 < top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, NEG_INF)
    if 0.0 < top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop = (cum - sorted_scores.softmax(dim=-1)) >= top_p  # keep the smallest prefix reaching top_p
        scores = scores.scatter(1, order, sorted_scores.masked_fill(drop, NEG_INF))
    probs = scores.softmax(dim=-1)
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / race).argmax(dim=-1)


# -- beam search ------------------------------------------------------------------------------
@dataclass
class Hypothesis:
    score: float
    tokens: list[int]


class BeamSearch:
    """Beam search over ``batch * num_beams`` rows, with finished hypotheses kept per batch entry.

    ``step`` picks the next beams on the device (2 * num_beams candidates per batch entry, ranked by
    cumulative log-probability) and returns the source row of each new beam and its token. Finished
    hypotheses are collected on the host, once per step, since their number changes the search.
    """

    def __init__(self, batch: int, num_beams: int, eos: list[int], length_penalty: float, early_stopping: bool,
                 device: torch.device) -> None:
        self.batch, self.beams = batch, num_beams
        self.eos = set(eos)
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        scores = torch.zeros((batch, num_beams), dtype=torch.float32, device=device)
        scores[:, 1:] = NEG_INF  # all beams start equal: only the first one may expand
        self.scores = scores.reshape(-1)
        self.finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
        self.batch_done = [False] * batch

    def _penalised(self, score: float, length: int) -> float:
        return score / (length ** self.length_penalty)

    def _add(self, b: int, hyp: Hypothesis) -> None:
        hyps = self.finished[b]
        hyps.append(hyp)
        hyps.sort(key=lambda h: h.score, reverse=True)
        del hyps[self.beams:]

    def _is_done(self, b: int, best_running: float, length: int) -> bool:
        hyps = self.finished[b]
        if len(hyps) < self.beams:
            return False
        if self.early_stopping:
            return True
        return hyps[-1].score >= self._penalised(best_running, length)

    def step(self, scores: torch.Tensor, sequences: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
        """scores [rows, vocab] (processed logits), sequences [rows, length] -> (source rows, tokens)."""
        vocab = scores.shape[-1]
        logp = scores.float().log_softmax(dim=-1) + self.scores[:, None]
        top, idx = logp.reshape(self.batch, -1).topk(2 * self.beams, dim=-1)
        top_h, idx_h = top.cpu().tolist(), idx.cpu().tolist()
        seq_h = sequences.cpu().tolist()
        length = sequences.shape[1] + 1
        src, tok, new_scores = [], [], []
        for b in range(self.batch):
            picked = 0
            for rank, (s, i) in enumerate(zip(top_h[b], idx_h[b])):
                row, t = b * self.beams + i // vocab, i % vocab
                if self.batch_done[b]:
                    break
                if t in self.eos:
                    if rank < self.beams:
                        self._add(b, Hypothesis(self._penalised(s, length), seq_h[row]))  # EOS not kept
                    continue
                src.append(row)
                tok.append(t)
                new_scores.append(s)
                picked += 1
                if picked == self.beams:
                    break
            if self.batch_done[b] or picked < self.beams:  # a finished entry keeps padding its beams
                for _ in range(self.beams - picked):
                    src.append(b * self.beams)
                    tok.append(pad)
                    new_scores.append(NEG_INF if not self.batch_done[b] else 0.0)
            if not self.batch_done[b]:
                self.batch_done[b] = self._is_done(b, max(top_h[b]), length)
        dev = scores.device
        self.scores = torch.tensor(new_scores, dtype=torch.float32, device=dev)
        return torch.tensor(src, dtype=torch.long, device=dev), torch.tensor(tok, dtype=torch.long, device=dev)

    def done(self) -> bool:
        return all(self.batch_done)

    def finalize(self, sequences: torch.Tensor, num_return: int) -> list[list[int]]:
        """The best ``num_return`` hypotheses per batch entry, the running beams counted as candidates."""
        seq_h = sequences.cpu().tolist()
        scores = self.scores.cpu().tolist()
        length = sequences.shape[1]
        out: list[list[int]] = []
        for b in range(self.batch):
            if not self.batch_done[b]:
                for j in range(self.beams):
                    row = b * self.beams + j
                    if not math.isinf(scores[row]):
                        self._add(b, Hypothesis(self._penalised(scores[row], length), seq_h[row]))
            out.extend(h.tokens for h in self.finished[b][:num_return])
        return out
