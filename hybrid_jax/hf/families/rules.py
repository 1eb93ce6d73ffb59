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


@dataclasses.dataclass(frozen=True)
class Rule:
  """One checkpoint tensor: `name`, and the parameters (block-relative or top-level paths, each with its layout
  change) it holds, in order along axis 0 (`interleave` > 0: split per head into that many parts, Qwen3.5's q_proj
  [heads x (query | gate)]).

  `stored`: the tensor is one fused tensor of the model (`name` is then the module's, not on disk) that the
  checkpoint holds cut into these tensors along axis 0, one per part in a released checkpoint. Import reads them
  concatenated in order, whatever their cut (transformers' own `save_pretrained` cuts OLMo Hybrid's fused q | k | v
  conv into near-equal thirds), and splits the whole by the parts' widths; export writes one tensor per part."""
  name: str
  parts: tuple  # ((path, Transform), ...)
  interleave: int = 0
  stored: tuple = ()  # (checkpoint tensor name, ...): one per part

  def __post_init__(self):
    if self.stored and (len(self.stored) != len(self.parts) or self.interleave):
      raise ValueError(f'rule {self.name!r}: a tensor stored cut holds one stored tensor per part, concatenated')

  def hf_shape(self, shapes) -> tuple:
    hf = [transform.hf_shape(shape) for (_, transform), shape in zip(self.parts, shapes)]
    if len(hf) == 1:
      return hf[0]
    return (sum(s[0] for s in hf), *hf[0][1:])

  def split(self, y, shapes) -> list:
    if len(self.parts) == 1:
      return [y]
    hf = [transform.hf_shape(shape) for (_, transform), shape in zip(self.parts, shapes)]
    if self.interleave:
      heads = shapes[0][1]  # [embed, heads, head_dim] parts.
      per_head = y.reshape(heads, -1, y.shape[-1])
      return [p.reshape(-1, y.shape[-1]) for p in np.split(per_head, self.interleave, axis=1)]
    return np.split(y, np.cumsum([s[0] for s in hf])[:-1], axis=0)

  def join(self, pieces, shapes):
    if len(pieces) == 1:
      return pieces[0]
    if self.interleave:
      heads = shapes[0][1]
      return np.concatenate([p.reshape(heads, -1, p.shape[-1]) for p in pieces], axis=1).reshape(-1,
                                                                                               pieces[0].shape[-1])
    return np.concatenate(pieces, axis=0)


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
