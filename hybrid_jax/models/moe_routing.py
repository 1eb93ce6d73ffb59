"""Routers of a mixture-of-experts layer: router logits in, each token's experts and their weights out.

Routing is kept apart from the experts' computation (hybrid_jax.models.moe), so expert parallelism can later move
tokens between devices between the two, and an imported checkpoint's router is one choice of `model.moe.router`:

- 'softmax_topk' (Mixtral, Qwen-MoE, Granite): softmax over all experts, the top k, optionally renormalised to sum
  to 1 (`norm_topk_prob`; Mixtral always renormalises, which equals 'topk_softmax').
- 'topk_softmax' (gpt-oss): the top k logits, then a softmax over those k.
- 'sigmoid' (DeepSeek-V3, Nemotron 3): sigmoid scores; a bias that is not trained by gradients (the auxiliary-loss-
  free balancing bias, Hugging Face's `e_score_correction_bias`) is added to the scores for choosing experts only,
  the weights are the unbiased scores; optional grouped top-k (the experts split into `n_group` groups, a group
  scored by the sum of its two best biased scores, only the best `topk_group` groups eligible), renormalisation
  and a final `routed_scaling_factor`.

Ties go to the lower expert index (jax.lax.top_k's order). The weights are float32.
"""

import dataclasses

import jax
import jax.numpy as jnp

ROUTERS = ('softmax_topk', 'topk_softmax', 'sigmoid')


@dataclasses.dataclass(frozen=True)
class RouterConfig:
  """The routing rule of one MoE layer (the router keys of model.moe)."""
  router: str
  top_k: int
  norm_topk_prob: bool = True
  n_group: int = 1
  topk_group: int = 1
  routed_scaling_factor: float = 1.0

  @classmethod
  def of(cls, moe_cfg) -> 'RouterConfig':
    return cls(router=str(moe_cfg.router), top_k=int(moe_cfg.top_k), norm_topk_prob=bool(moe_cfg.norm_topk_prob),
               n_group=int(moe_cfg.n_group), topk_group=int(moe_cfg.topk_group),
               routed_scaling_factor=float(moe_cfg.routed_scaling_factor))


@dataclasses.dataclass(frozen=True)
class Routing:
  """Each token's choice: `experts` int32 [N, k], `weights` float32 [N, k] (what multiplies each expert's output),
  and `probs` float32 [N, E], the router's distribution over all experts that the balance loss and the entropy
  read (the softmax, or for 'sigmoid' the scores normalised to sum to 1)."""
  experts: jax.Array
  weights: jax.Array
  probs: jax.Array


def route(logits, rc: RouterConfig, bias=None) -> Routing:
  """Routing of router logits [N, E] (float32) by `rc`; `bias` [E] is the 'sigmoid' router's selection bias."""
  logits = logits.astype(jnp.float32)
  if rc.router == 'softmax_topk':
    probs = jax.nn.softmax(logits, axis=-1)
    weights, experts = jax.lax.top_k(probs, rc.top_k)
    if rc.norm_topk_prob:
      weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  elif rc.router == 'topk_softmax':
    top, experts = jax.lax.top_k(logits, rc.top_k)
    weights = jax.nn.softmax(top, axis=-1)
    probs = jax.nn.softmax(logits, axis=-1)
  elif rc.router == 'sigmoid':
    scores = jax.nn.sigmoid(logits)
    choice = scores if bias is None else scores + jax.lax.stop_gradient(bias.astype(jnp.float32))
    if rc.n_group > 1:
      choice = _best_groups_only(choice, rc.n_group, rc.topk_group)
    _, experts = jax.lax.top_k(jax.lax.stop_gradient(choice), rc.top_k)
    weights = jnp.take_along_axis(scores, experts, axis=-1)
    if rc.norm_topk_prob:
      weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
  else:
    raise ValueError(f'unknown router {rc.router!r}; known: {", ".join(ROUTERS)}')
  if rc.routed_scaling_factor != 1.0:
    weights = weights * rc.routed_scaling_factor
  return Routing(experts.astype(jnp.int32), weights, probs)


def _best_groups_only(choice, n_group: int, topk_group: int):
  """`choice` [N, E] with the experts outside each token's best `topk_group` groups set to -inf; a group's score
  is the sum of its two best entries (DeepSeek-V3; one entry when a group has one expert)."""
  n, e = choice.shape
  grouped = choice.reshape(n, n_group, e // n_group)
  group_scores = jnp.sum(jax.lax.top_k(grouped, min(2, e // n_group))[0], axis=-1)  # [N, n_group]
  _, best = jax.lax.top_k(group_scores, topk_group)
  keep = jnp.zeros((n, n_group), bool).at[jnp.arange(n)[:, None], best].set(True)
  return jnp.where(keep[:, :, None], grouped, -jnp.inf).reshape(n, e)


def load_fractions(experts, num_experts: int):
  """float32 [E]: the fraction of all N * k assignments each expert received (they sum to 1)."""
  counts = jnp.zeros((num_experts,), jnp.float32).at[experts.reshape(-1)].add(1.0)
  return counts / experts.size


def balance_loss(load, probs):
  """Switch Transformer's load-balancing loss E * sum_e f_e * P_e: f = `load` (assignment fractions, no gradient),
  P = the mean router distribution over the tokens. 1 at uniform load and uniform P; its gradient pushes P (hence
  the router) away from the experts that got more than their share."""
  num_experts = probs.shape[-1]
  return num_experts * jnp.sum(jax.lax.stop_gradient(load) * jnp.mean(probs, axis=0))


def z_loss(logits):
  """Router z-loss (ST-MoE): the mean over tokens of logsumexp(logits)^2, which keeps router logits small."""
  return jnp.mean(jnp.square(jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)))


def statistics(logits, routing: Routing, num_experts: int, dropped) -> dict:
  """The router's statistics and auxiliary terms of one layer on one (micro-)batch, float32:
  'aux_loss' (balance_loss), 'z_loss', 'load' [E] (load_fractions), 'load_cv' (their coefficient of variation:
  0 at uniform load), 'entropy' (mean entropy of the router distribution, nats), 'dropped' (assignments dropped by
  the capacity limit)."""
  load = load_fractions(routing.experts, num_experts)
  probs = routing.probs
  entropy = -jnp.mean(jnp.sum(jnp.where(probs > 0, probs * jnp.log(jnp.where(probs > 0, probs, 1.0)), 0.0), -1))
  return {'aux_loss': balance_loss(load, probs), 'z_loss': z_loss(logits), 'load': load,
          'load_cv': jnp.std(load) * num_experts, 'entropy': entropy,
          'dropped': jnp.asarray(dropped, jnp.float32)}


def bias_update(bias, load, rate: float):
  """DeepSeek-V3's auxiliary-loss-free balancing: each expert's selection bias moves by `rate` toward balance,
  up for an expert below the mean load, down for one above (bias += rate * sign(mean load - load))."""
  return bias + rate * jnp.sign(jnp.mean(load, axis=-1, keepdims=True) - load).astype(bias.dtype)
