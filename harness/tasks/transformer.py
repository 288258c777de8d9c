"""The built-in task `transformer`: a GPT-style decoder-only language model predicting the next token
of the Python standard library's source (bytes) or of synthetic token sequences (harness.data.tokens).

The model: token and learned position embeddings, `layers` pre-LayerNorm blocks (causal
self-attention, then a 4x-wide GELU MLP, each added to the residual stream), a final LayerNorm and
an output projection. The head is untied (its own weight, no bias): the kit's FSDP shards each
top-level child as one unit and DeepSpeed's ZeRO-3 gathers per module, and a weight shared by the
embedding unit and the head unit is not something either shards. The model is an `nn.Sequential`
of the embeddings, each block and the head, so that every block is an FSDP unit of its own.
Initialisation is GPT-2's: N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers).

Loss: next-token cross entropy averaged over the batch's tokens (counted as tokens, so reported
losses weight by them); evaluation: the loss as sums over tokens, reduced over ranks, and the
perplexity exp(loss) derived from the reduced mean (Task.derived_metrics), so both are exact at any
world size. Parameters: 2 * vocab * width + sequence_length * width + layers * (12 width^2 + 13
width) + 2 width (`parameter_count`), from about 1M (the defaults) to over 1B (e.g. --layers 24
--width 2048 --heads 16 --sequence-length 1024).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DATA_DIR
from ..data.tokens import (
    BRANCHES,
    BYTE_VOCABULARY,
    SYNTHETIC_SEED,
    SYNTHETIC_WINDOWS,
    corpus_windows,
    synthetic_windows,
)
from ..errors import UsageError, unknown_choice
from ..options import BaseOptions, option
from .images import PREPARE_WAIT_S
from .task import BuiltinTask, Task

TOKEN_SOURCES = ("corpus", "synthetic")
INIT_STD = 0.02  # GPT-2's
EXP_LIMIT = 709.0  # math.exp overflows a float64 above about 709.78


@dataclass(frozen=True)
class TransformerOptions(BaseOptions):
    """The `transformer` task's arguments (each a `harness train` flag)."""

    layers: int = option(4, "--layers", "transformer: decoder blocks")
    width: int = option(128, "--width", "transformer: model width d_model (the MLP is 4x wider)")
    heads: int = option(4, "--heads", "transformer: attention heads (must divide --width)")
    sequence_length: int = option(128, "--sequence-length", "transformer: tokens per sample (the context)")
    tokens: str = option(
        "corpus",
        "--tokens",
        "transformer: corpus (the Python standard library's source as bytes, built offline once) or synthetic",
    )
    vocab: Optional[int] = option(
        None, "--vocab", "transformer: synthetic tokens' vocabulary (default 256; the corpus is bytes: 256)", type=int
    )
    test_windows: Optional[int] = option(
        None,
        "--test-windows",
        f"transformer: held-out windows of the synthetic tokens scored at each evaluation (default "
        f"{SYNTHETIC_WINDOWS['test']}); fewer evaluate faster, with a wider spread",
        type=int,
    )
    dropout: float = option(
        0.0, "--transformer-dropout", "transformer: dropout of embeddings, attention and residual branches"
    )
    data_dir: str = option(DATA_DIR, "--tokens-dir", "transformer: directory whose prepared/ holds the corpus")

    def validate(self) -> None:
        for flag, value in (("--layers", self.layers), ("--width", self.width), ("--heads", self.heads)):
            if value < 1:
                raise UsageError(f"{flag} must be a positive integer, got {value}")
        if self.sequence_length < 1:
            raise UsageError(f"--sequence-length must be a positive integer, got {self.sequence_length}")
        if self.width % self.heads:
            divisors = [count for count in range(1, min(self.width, 64) + 1) if self.width % count == 0]
            raise UsageError(
                f"--heads {self.heads} does not divide --width {self.width}; choose --heads from "
                f"{', '.join(map(str, divisors))} or a --width that {self.heads} divides"
            )
        if self.tokens not in TOKEN_SOURCES:
            raise unknown_choice("--tokens", self.tokens, TOKEN_SOURCES)
        if self.vocab is not None and self.tokens != "synthetic":
            raise UsageError("--vocab sets the synthetic tokens' vocabulary; drop it (the corpus is bytes: 256)")
        if self.vocab is not None and self.vocab < 2:
            raise UsageError(f"--vocab must be at least 2, got {self.vocab}")
        if self.test_windows is not None and self.tokens != "synthetic":
            raise UsageError(
                "--test-windows sets the synthetic tokens' held-out windows; drop it (the corpus's test split is whole)"
            )
        if self.test_windows is not None and self.test_windows < 1:
            raise UsageError(f"--test-windows must be a positive integer, got {self.test_windows}")
        if not 0 <= self.dropout < 1:
            raise UsageError(f"--transformer-dropout must be in [0, 1), got {self.dropout}")

    @property
    def vocabulary(self) -> int:
        """The vocabulary the data has."""
        return self.vocab or BYTE_VOCABULARY


def parameter_count(options: TransformerOptions) -> int:
    """The model's parameters, from its shape alone (the module docstring's formula)."""
    width, vocab = options.width, options.vocabulary
    block = 12 * width * width + 13 * width  # attention 4 w^2 + 4 w, MLP 8 w^2 + 5 w, two norms 4 w
    return 2 * vocab * width + options.sequence_length * width + options.layers * block + 2 * width


class Embeddings(nn.Module):
    """Token and learned position embeddings, summed, then dropout."""

    def __init__(self, vocab: int, sequence_length: int, width: int, dropout: float) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(sequence_length, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.dropout(self.token(tokens) + self.position(positions))


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which a position sees itself and the positions before it."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.projection = nn.Linear(width, width)
        self.residual_dropout = nn.Dropout(dropout)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        batch, length, width = hidden.shape
        query, key, value = (
            part.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
            for part in self.qkv(hidden).split(width, dim=2)
        )
        attended = F.scaled_dot_product_attention(
            query, key, value, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.residual_dropout(self.projection(attended.transpose(1, 2).reshape(batch, length, width)))


class Block(nn.Module):
    """Pre-LayerNorm decoder block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads, dropout)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attention(self.attention_norm(hidden))
        return hidden + self.mlp(self.mlp_norm(hidden))


class Head(nn.Module):
    """Final LayerNorm and the projection to logits over the vocabulary (untied, no bias)."""

    def __init__(self, width: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.output = nn.Linear(width, vocab, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(hidden))


class DecoderTransformer(nn.Sequential):
    """Token ids [batch, length] -> logits [batch, length, vocab]: embeddings, blocks, head."""

    def __init__(self, options: TransformerOptions) -> None:
        width, dropout = options.width, options.dropout
        super().__init__(
            Embeddings(options.vocabulary, options.sequence_length, width, dropout),
            *(Block(width, options.heads, dropout) for _ in range(options.layers)),
            Head(width, options.vocabulary),
        )
        for name, parameter in self.named_parameters():
            if parameter.dim() < 2:  # biases and LayerNorms keep their zeros and ones
                continue
            residual = name.endswith(("attention.projection.weight", "mlp.2.weight"))
            std = INIT_STD / math.sqrt(2 * options.layers) if residual else INIT_STD
            nn.init.normal_(parameter, mean=0.0, std=std)
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)


def next_token_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """The mean cross entropy of every position's next token, and the tokens it averages."""
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)), targets.numel()


def next_token_scores(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, tuple]:
    """The summed cross entropy over the batch's tokens, and their count."""
    inputs, targets = batch
    logits = model(inputs).float()
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")
    return {"loss": (total, targets.numel())}


def perplexity(means: Any) -> dict[str, float]:
    """exp of the mean loss over every test token (derived from the reduced sums)."""
    loss = means["loss"]
    return {"perplexity": math.exp(loss) if loss < EXP_LIMIT else math.inf}  # a diverged run, not an OverflowError


def transformer_task(**arguments: Any) -> Task:
    """The built-in language-model task with these TransformerOptions (by field name)."""
    options = TransformerOptions.parse("task 'transformer'", arguments)
    if options.tokens == "corpus":
        windows: dict[str, Any] = corpus_windows(options.data_dir, options.sequence_length, PREPARE_WAIT_S)
        data, source = "stdlib-bytes", os.path.basename(os.path.dirname(windows["train"].path))
    else:
        windows = synthetic_windows(options.sequence_length, options.vocabulary, options.test_windows)
        data, source = "synthetic-tokens", f"Markov chain, {BRANCHES} successors per token, seed {SYNTHETIC_SEED}"
    return Task(
        build_model=lambda: DecoderTransformer(options),
        train_data=windows["train"],
        test_data=windows["test"],
        loss=next_token_loss,
        metrics=next_token_scores,
        derived_metrics=perplexity,
        name="transformer",
        description={
            "model": f"transformer-{options.layers}x{options.width}",
            "data": data,
            "samples": f"{options.sequence_length} tokens, vocabulary {options.vocabulary}",
            "tokens": source,  # the corpus's Python version and fingerprint: which bytes were trained on
        },
    )


TRANSFORMER = BuiltinTask(
    "transformer",
    transformer_task,
    TransformerOptions,
    "a GPT-style decoder-only transformer predicting the next byte of the Python standard library (or synthetic tokens)",
)
