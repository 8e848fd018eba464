"""A tiny causal transformer (policy and critic) and the model plumbing around it.

Random initialisation, an in-code vocabulary, no downloads: the demo trains it from
scratch on CPU. The policy never emits PAD or BOS (their logits are masked), so the
sampling distribution and the log-probs used by the loss are the same distribution.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from otel_rl.demo._task import BOS, EOS, PAD, VOCAB_SIZE

# Large finite negative instead of -inf: softmax still gives exact zeros and
# entropy's p * logit stays 0 instead of nan.
_MASKED_LOGIT = -1e9


class _Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.ln2(x))


class TinyCausalLM(nn.Module):
    """Decoder-only transformer over the demo vocabulary.

    ``out_dim=None`` gives a language-model head (policy / reference); ``out_dim=1`` gives
    a scalar value head (PPO critic) on the same backbone shape. ``eos_logit`` starts the LM
    head's EOS bias there, so the fresh policy ends most answers within the budget, as the
    instruction-tuned model an RL run starts from does (uniform sampling would truncate ~2/3).
    """

    def __init__(
        self,
        *,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        d_ff: int = 128,
        max_len: int = 32,
        out_dim: int | None = None,
        eos_logit: float = 0.0,
    ) -> None:
        super().__init__()
        self.is_lm = out_dim is None
        self.tok = nn.Embedding(VOCAB_SIZE, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB_SIZE if out_dim is None else out_dim)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
        if self.is_lm:
            with torch.no_grad():
                self.head.bias[EOS] = eos_logit

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids, mask: [B, T] (left-padded prompts, right-padded responses) -> [B, T, out]."""
        t = ids.shape[1]
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        x = self.tok(ids) + self.pos(pos)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        allowed = causal & mask.bool()[:, None, :]
        # every position may see itself, so padded rows never softmax over nothing
        allowed = (allowed | torch.eye(t, dtype=torch.bool))[:, None, :, :]
        for block in self.blocks:
            x = block(x, allowed)
        out = self.head(self.ln_f(x))
        if self.is_lm:
            out = out.clone()
            out[..., PAD] = _MASKED_LOGIT
            out[..., BOS] = _MASKED_LOGIT
        return out


@dataclass
class Rollout:
    """One batch of sampled responses, aligned for the loss.

    input_ids / attention_mask: [B, P + R]; prompt_width P; response_mask [B, R] is 1 on
    generated tokens up to and including EOS; truncated [B] marks responses that used the
    whole token budget without EOS; sample_ids [B] number the samples in generation order
    (with G samples per prompt, sample_id // G is the GRPO group) and travel with the rows.
    rollout_log_probs [B, R]: the log-prob the generating model gave each sampled token (as vLLM
    returns it), 0 past the response; None for greedy decoding.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_width: int
    response_mask: torch.Tensor
    truncated: torch.Tensor
    sample_ids: torch.Tensor | None = None
    rollout_log_probs: torch.Tensor | None = None

    def select(self, idx: torch.Tensor) -> Rollout:
        """The sub-batch of rows ``idx`` (a mini-batch)."""
        return Rollout(
            input_ids=self.input_ids[idx],
            attention_mask=self.attention_mask[idx],
            prompt_width=self.prompt_width,
            response_mask=self.response_mask[idx],
            truncated=self.truncated[idx],
            sample_ids=None if self.sample_ids is None else self.sample_ids[idx],
            rollout_log_probs=None if self.rollout_log_probs is None else self.rollout_log_probs[idx],
        )

    @property
    def responses(self) -> torch.Tensor:
        return self.input_ids[:, self.prompt_width :]

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)

    @property
    def prompt_lengths(self) -> torch.Tensor:
        return self.attention_mask[:, : self.prompt_width].sum(-1)


@torch.no_grad()
def generate(
    model: TinyCausalLM,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    token_times: list[float] | None = None,
) -> Rollout:
    """Temperature sampling (or greedy decoding) until EOS or the token budget.

    token_times: when given, ``time.perf_counter()`` is appended to it before the first
    decoding iteration and after each one (entry k: every sample still running has k tokens),
    the engine-side timestamps the rollout's request metrics (TTFT, TPOT, latency) come from.
    """
    ids, mask = prompt_ids, prompt_mask
    finished = torch.zeros(ids.shape[0], dtype=torch.bool)
    sampled_logp: list[torch.Tensor] = []
    if token_times is not None:
        token_times.append(time.perf_counter())
    for _ in range(max_new_tokens):
        logits = model(ids, mask)[:, -1, :]
        if greedy:
            tok = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            # the sampler's own log-prob of the token (vLLM's logprobs): the trainer recomputes it
            taken = torch.log_softmax(logits / temperature, dim=-1).gather(-1, tok[:, None]).squeeze(-1)
            sampled_logp.append(torch.where(finished, torch.zeros_like(taken), taken))
        tok = torch.where(finished, torch.full_like(tok, PAD), tok)
        ids = torch.cat([ids, tok[:, None]], dim=1)
        mask = torch.cat([mask, (~finished).long()[:, None]], dim=1)
        finished = finished | (tok == EOS)
        if token_times is not None:
            token_times.append(time.perf_counter())
        if bool(finished.all()):
            break
    width = prompt_ids.shape[1]
    pad = width + max_new_tokens - ids.shape[1]
    if pad:
        ids = F.pad(ids, (0, pad), value=PAD)
        mask = F.pad(mask, (0, pad), value=0)
    rollout_logp = None
    if sampled_logp:
        rollout_logp = F.pad(torch.stack(sampled_logp, dim=1), (0, max_new_tokens - len(sampled_logp)), value=0.0)
    return Rollout(
        input_ids=ids,
        attention_mask=mask,
        prompt_width=width,
        response_mask=mask[:, width:].clone(),
        truncated=~finished,
        sample_ids=torch.arange(ids.shape[0]),
        rollout_log_probs=rollout_logp,
    )


def response_log_probs(model: TinyCausalLM, rollout: Rollout, *, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-prob of each response token and the policy entropy there, [B, R]."""
    logits = model(rollout.input_ids, rollout.attention_mask)
    logits = logits[:, rollout.prompt_width - 1 : -1, :] / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, rollout.responses.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def response_values(critic: TinyCausalLM, rollout: Rollout) -> torch.Tensor:
    """Critic value of the state before each response token, [B, R]."""
    v = critic(rollout.input_ids, rollout.attention_mask)[..., 0]
    return v[:, rollout.prompt_width - 1 : -1]


class HostOffload:
    """Moves a module's parameters (and optionally its optimizer state) to a host-side copy.

    The demo's stand-in for ROLL's ``strategy.offload_states()`` / ``load_states()``:
    ``offload()`` copies every parameter into a host buffer, frees the module's own storage
    and drops gradients; ``onload()`` copies the host buffers back. On CPU both sides live
    in RAM, so it is cheap, but it is real: an offloaded module holds no weights.
    """

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.module = module
        self.optimizer = optimizer
        self._params: dict[str, torch.Tensor] = {}
        self._optim: dict[int, dict[str, torch.Tensor]] = {}
        self.loaded = True
        self.optimizer_loaded = True

    def _optimizer_states(self):
        if self.optimizer is None:
            return
        for p in self.module.parameters():
            state = self.optimizer.state.get(p)
            if state:
                yield p, state

    @torch.no_grad()
    def offload(self) -> None:
        if self.optimizer_loaded:
            for p, state in self._optimizer_states():
                self._optim[id(p)] = {k: v.clone() for k, v in state.items() if torch.is_tensor(v)}
                for k in self._optim[id(p)]:
                    state[k] = torch.empty(0, dtype=state[k].dtype)
            self.optimizer_loaded = False
        if self.loaded:
            for name, p in self.module.named_parameters():
                self._params[name] = p.detach().clone()
                p.grad = None
                p.data = torch.empty(0, dtype=p.dtype)
            self.loaded = False

    @torch.no_grad()
    def onload(self, *, with_optimizer: bool = True) -> None:
        if not self.loaded:
            for name, p in self.module.named_parameters():
                p.data = self._params.pop(name).clone()
            self.loaded = True
        if with_optimizer and not self.optimizer_loaded:
            for p, state in self._optimizer_states():
                state.update({k: v.clone() for k, v in self._optim.pop(id(p), {}).items()})
            self.optimizer_loaded = True

    def host_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's weights wherever they are now (host copy while offloaded)."""
        if self.loaded:
            return {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        return {k: v.clone() for k, v in self._params.items()}
