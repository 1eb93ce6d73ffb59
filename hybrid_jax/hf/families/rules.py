"""Tensor rules: which checkpoint tensor holds which hybrid_jax parameters, and how their layouts differ.

A rule may split one tensor into several parameters (a fused in_proj [z | x | B | C | dt], a q_proj interleaving
query and gate per head) and joins them back on export. The families (config.py) are written in these rules;
hybrid_jax.hf.families.weights applies them.
"""

import dataclasses
import math

import numpy as np

from hybrid_jax.hf.tensors import HEADS_IN, HEADS_OUT, SAME, TRANSPOSE, Transform

# [C, 1, K] depthwise conv weight <-> ours [K, *channels].
CONV = Transform(lambda x: x.reshape(x.shape[0], -1).T[:, None, :], lambda y, shape: y[:, 0, :].T.reshape(shape),
                 lambda s: (math.prod(s[1:]), 1, s[0]))
# A zero-centred norm weight w (the norm scales by 1 + w; Qwen3.5) <-> our scale 1 + w.
ZERO_CENTRED = Transform(lambda x: x - 1, lambda y, shape: y + 1, lambda s: tuple(s))
# A flat vector over every head's channels <-> ours [heads, dim].
FLAT = Transform(lambda x: x.reshape(-1), lambda y, shape: y.reshape(shape), lambda s: (math.prod(s),))
# Stacked expert matrices: a Linear weight per expert [E, out, in] <-> ours [E, in, out].
EXPERTS = Transform(lambda x: np.swapaxes(x, 1, 2), lambda y, shape: np.swapaxes(y, 1, 2), lambda s: (s[0], s[2], s[1]))
# A one-output Linear weight [1, in] (Qwen's shared-expert gate) <-> ours [in].
ROW = Transform(lambda x: x[None], lambda y, shape: y.reshape(shape), lambda s: (1, *s))


@dataclasses.dataclass(frozen=True)
class Rule:
  """One checkpoint tensor: `name`, and the parameters (block-relative or top-level paths, each with its layout
  change) it holds, in order along `axis` (0 unless said: stacked experts' fused gate | up rows are axis 1).
  `interleave` > 0: the tensor is `groups` blocks (default: the first part's heads), each holding that many parts
  in order, each part its share of its own rows (Qwen3.5's q_proj [heads x (query | gate)]; Qwen3-Next's
  in_proj_qkvz [key heads x (q | k | v | z)], whose parts differ in width).

  `alternate`: the parts alternate element by element along `axis` instead of following one another (gpt-oss'
  gate_up_proj: gate in the even columns, up in the odd ones).

  `stored`: the tensor is one fused tensor of the model (`name` is then the module's, not on disk) that the
  checkpoint holds cut into these tensors along axis 0, one per part in a released checkpoint. Import reads them
  concatenated in order, whatever their cut (transformers' own `save_pretrained` cuts OLMo Hybrid's fused q | k | v
  conv into near-equal thirds), and splits the whole by the parts' widths; export writes one tensor per part."""
  name: str
  parts: tuple  # ((path, Transform), ...)
  interleave: int = 0
  stored: tuple = ()  # (checkpoint tensor name, ...): one per part
  axis: int = 0
  groups: int = 0  # With `interleave`: blocks along axis 0 (0 = the first part's heads, shapes[0][1]).
  alternate: bool = False

  def __post_init__(self):
    if self.stored and (len(self.stored) != len(self.parts) or self.interleave):
      raise ValueError(f'rule {self.name!r}: a tensor stored cut holds one stored tensor per part, concatenated')
    if self.alternate and (self.interleave or self.stored):
      raise ValueError(f'rule {self.name!r}: alternating parts are neither interleaved in blocks nor stored cut')

  def hf_shape(self, shapes) -> tuple:
    hf = [transform.hf_shape(shape) for (_, transform), shape in zip(self.parts, shapes)]
    if len(hf) == 1:
      return hf[0]
    a = self.axis
    return (*hf[0][:a], sum(s[a] for s in hf), *hf[0][a + 1:])

  def _groups(self, shapes) -> int:
    return self.groups or shapes[0][1]  # [embed, heads, head_dim] parts.

  def split(self, y, shapes) -> list:
    if len(self.parts) == 1:
      return [y]
    hf = [transform.hf_shape(shape) for (_, transform), shape in zip(self.parts, shapes)]
    if self.alternate:
      n = len(self.parts)
      return [np.take(y, np.arange(j, y.shape[self.axis], n), axis=self.axis) for j in range(n)]
    if self.interleave:
      groups = self._groups(shapes)
      per_group = y.reshape(groups, -1, y.shape[-1])
      cuts = np.cumsum([s[0] // groups for s in hf])[:-1]
      return [p.reshape(-1, y.shape[-1]) for p in np.split(per_group, cuts, axis=1)]
    return np.split(y, np.cumsum([s[self.axis] for s in hf])[:-1], axis=self.axis)

  def join(self, pieces, shapes):
    if len(pieces) == 1:
      return pieces[0]
    if self.alternate:
      stacked = np.stack(pieces, axis=self.axis + 1)
      return stacked.reshape(*stacked.shape[:self.axis], -1, *stacked.shape[self.axis + 2:])
    if self.interleave:
      groups = self._groups(shapes)
      return np.concatenate([p.reshape(groups, -1, p.shape[-1]) for p in pieces], axis=1).reshape(
          -1, pieces[0].shape[-1])
    return np.concatenate(pieces, axis=self.axis)


def block_norm_rules(p: str, mixer_norm: str, mlp_norm: str, transform=SAME) -> list[Rule]:
  """A block's two norms: the mixer's (`p + mixer_norm + '.weight'`) and the MLP's."""
  return [Rule(p + mixer_norm + '.weight', ((('mixer_norm', 'scale'), transform),)),
          Rule(p + mlp_norm + '.weight', ((('mlp_norm', 'scale'), transform),))]


def attention_rules(p: str, options: dict, *, gate_interleaved=False) -> list[Rule]:
  q = Rule(p + 'q_proj.weight', ((('mixer', 'wq'), HEADS_IN), (('mixer', 'wgate'), HEADS_IN)), interleave=2) \
      if gate_interleaved else Rule(p + 'q_proj.weight', ((('mixer', 'wq'), HEADS_IN),))
  rules = [q, Rule(p + 'k_proj.weight', ((('mixer', 'wk'), HEADS_IN),)),
           Rule(p + 'v_proj.weight', ((('mixer', 'wv'), HEADS_IN),)),
           Rule(p + 'o_proj.weight', ((('mixer', 'wo'), HEADS_OUT),))]
  norm = options.get('qk_norm')
  if norm:
    transform = {'head': ZERO_CENTRED if options.get('zero_centred') else SAME, 'all': FLAT}[norm]
    rules += [Rule(p + 'q_norm.weight', ((('mixer', 'q_norm'), transform),)),
              Rule(p + 'k_norm.weight', ((('mixer', 'k_norm'), transform),))]
  return rules


def attention_bias_rules(p: str) -> list[Rule]:
  """Biases of the q, k, v and o projections under `p` (gpt-oss): [heads x head_dim] flat, o's [hidden]."""
  return [Rule(p + 'q_proj.bias', ((('mixer', 'bq'), FLAT),)), Rule(p + 'k_proj.bias', ((('mixer', 'bk'), FLAT),)),
          Rule(p + 'v_proj.bias', ((('mixer', 'bv'), FLAT),)), Rule(p + 'o_proj.bias', ((('mixer', 'bo'), SAME),))]


def mamba_rules(p: str, conv_bias: bool) -> list[Rule]:
  m = lambda name: ('mixer', name)
  rules = [Rule(p + 'in_proj.weight', ((m('in_z'), HEADS_IN), (m('in_x'), HEADS_IN), (m('in_b'), TRANSPOSE),
                                        (m('in_c'), TRANSPOSE), (m('in_dt'), TRANSPOSE))),
           Rule(p + 'conv1d.weight', ((m('conv_x'), CONV), (m('conv_b'), CONV), (m('conv_c'), CONV))),
           Rule(p + 'A_log', ((m('A_log'), SAME),)), Rule(p + 'D', ((m('D'), SAME),)),
           Rule(p + 'dt_bias', ((m('dt_bias'), SAME),)), Rule(p + 'norm.weight', ((m('norm'), FLAT),)),
           Rule(p + 'out_proj.weight', ((m('out'), HEADS_OUT),))]
  if conv_bias:
    rules.append(Rule(p + 'conv1d.bias', ((m('conv_bias_x'), FLAT), (m('conv_bias_b'), SAME),
                                          (m('conv_bias_c'), SAME))))
  return rules


def swiglu_rules(p: str, gate='gate_proj', up='up_proj', down='down_proj', path='mlp') -> list[Rule]:
  return [Rule(p + gate + '.weight', (((path, 'gate'), TRANSPOSE),)),
          Rule(p + up + '.weight', (((path, 'up'), TRANSPOSE),)),
          Rule(p + down + '.weight', (((path, 'down'), TRANSPOSE),))]


def moe_rules(path: tuple, router: str, down: str, *, gate_up: str | None = None, up: str | None = None,
              router_bias: str | None = None) -> list[Rule]:
  """An MoE's router (`router` [E, H], a Linear weight) and stacked experts (`path` + ('router', 'gate', ...)):
  gated experts' fused `gate_up` [E, 2I, H] (each expert's gate rows, then its up rows), or ungated ones' `up`
  [E, I, H]; `down` [E, H, I]; `router_bias` [E], the sigmoid router's selection bias. Checkpoints that store one
  tensor per expert are read through hybrid_jax.hf.families.experts, which stacks them into these names."""
  m = lambda name: (*path, name)
  rules = [Rule(router, ((m('router'), TRANSPOSE),)), Rule(down, ((m('down'), EXPERTS),))]
  if gate_up:
    rules.append(Rule(gate_up, ((m('gate'), EXPERTS), (m('up'), EXPERTS)), axis=1))
  else:
    rules.append(Rule(up, ((m('up'), EXPERTS),)))
  if router_bias:
    rules.append(Rule(router_bias, ((m('router_bias'), SAME),)))
  return rules


def transposed_expert_rules(path: tuple, q: str) -> list[Rule]:
  """gpt-oss' MoE under `q`: the router (`router.weight` [E, H] and its logit bias `router.bias` [E]) and experts
  stored as matrices used as they are, not Linear weights: `experts.gate_up_proj` [E, H, 2I] with gate and up in
  alternate columns (its bias [E, 2I] alike), `experts.down_proj` [E, I, H] and its bias [E, H]."""
  m = lambda name: (*path, name)
  e = q + 'experts.'
  return [Rule(q + 'router.weight', ((m('router'), TRANSPOSE),)),
          Rule(q + 'router.bias', ((m('router_logit_bias'), SAME),)),
          Rule(e + 'gate_up_proj', ((m('gate'), SAME), (m('up'), SAME)), axis=2, alternate=True),
          Rule(e + 'gate_up_proj_bias', ((m('gate_bias'), SAME), (m('up_bias'), SAME)), axis=1, alternate=True),
          Rule(e + 'down_proj', ((m('down'), SAME),)), Rule(e + 'down_proj_bias', ((m('down_bias'), SAME),))]


def shared_expert_rules(path: tuple, p: str, *, gate='gate_proj.weight', up='up_proj.weight',
                        down='down_proj.weight', gate_up=None, sigmoid_gate=None) -> list[Rule]:
  """An MoE's shared expert under `p`: SwiGLU (`gate`, `up`, or one fused `gate_up` [gate; up]) or, with `gate`
  None, ungated (squared ReLU); `down`; `sigmoid_gate`, Qwen's [1, H] gate on its output."""
  m = lambda name: (*path, name)
  if gate_up:
    rules = [Rule(p + gate_up, ((m('shared_gate_proj'), TRANSPOSE), (m('shared_up'), TRANSPOSE)))]
  else:
    rules = [Rule(p + up, ((m('shared_up'), TRANSPOSE),))]
    if gate:
      rules.append(Rule(p + gate, ((m('shared_gate_proj'), TRANSPOSE),)))
  rules.append(Rule(p + down, ((m('shared_down'), TRANSPOSE),)))
  if sigmoid_gate:
    rules.append(Rule(sigmoid_gate, ((m('shared_gate'), ROW),)))
  return rules
