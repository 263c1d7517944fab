"""PyTorch reference timings, for same-machine ratios against `scripts/bench.py`.

Needs torch (`pip install torch`, CPU wheel); not part of the package or the tests.
It rebuilds the two workloads of the released FedHCA2 code that issues 3 and 4 quote
PyTorch timings for, so the ratios in BENCHMARKS.md come from one machine and one
session rather than from figures taken elsewhere:

    python scripts/bench_torch.py --only=swin    # Swin-T + decoder + head local step, 128/224
    python scripts/bench_torch.py --only=hca2    # FedHCA2 server aggregation, N=6, K=9
    python scripts/bench_torch.py --dump_swin=ref.npz  # stage outputs for compare_torch.py

`swin`: the mmsegmentation Swin-T the released code uses (window padding, shifted-window
mask, relative position bias, Unfold patch merging, stage LayerNorms, drop path 0.1), the
FedHCA2 decoder (4 linears, bilinear resize to H/4, 1x1 fuse conv + BN + LeakyReLU) and
head (two stride-2 transposed convs and a 1x1 conv, 21 classes), the final bilinear resize,
cross-entropy and AdamW, batch 8, float32, as `bench.py --only=swin` runs it in JAX.

`hca2`: the released aggregation (`aggregate.py`, `hyperweight.py`): backbone deltas
flattened into one vector per client, Gram matrix, SciPy SLSQP for the CAGrad dual, the
rescaled CA update, homo averaging, personalised encoders, the cross-attention decoder
rule per parameter tensor, and the α/β hypergradient step by autograd through the
previous round's retained graph. Sizes as `bench.py --only=hca2`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types

import numpy as np

try:
  import torch
  import torch.nn.functional as F
  from torch import nn
except ImportError:  # an optional extra: --help works without it, main() names it after parsing
  torch = F = None
  nn = types.SimpleNamespace(Module=object)  # so that the model classes below still define

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from benchmarks.torch_compare import serve  # noqa: E402  (imports neither jax nor torch)


def _timeit(fn, repeats):
  best = float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


# ----------------------------------------------------------------------------- Swin (mmseg)

class DropPath(nn.Module):

  def __init__(self, p):
    super().__init__()
    self.p = p

  def forward(self, x):
    if not self.training or self.p == 0.:
      return x
    keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1 - self.p)
    return x * keep / (1 - self.p)


# Module and parameter names follow mmsegmentation's SwinTransformer, so that the state dict
# converts with `fedjax_mtl.models.convert` (source 'mmseg') for the stage-output check.

class WindowMSA(nn.Module):

  def __init__(self, dim, heads, window):
    super().__init__()
    self.heads, self.window = heads, window
    self.scale = (dim // heads) ** -0.5
    self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, heads))
    c = torch.arange(window)
    coords = torch.stack(torch.meshgrid(c, c, indexing='ij')).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + window - 1
    self.register_buffer('relative_position_index', rel[..., 0] * (2 * window - 1) + rel[..., 1])
    self.qkv = nn.Linear(dim, 3 * dim)
    self.proj = nn.Linear(dim, dim)

  def forward(self, x, mask=None):
    b, n, c = x.shape
    qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0] * self.scale, qkv[1], qkv[2]
    attn = q @ k.transpose(-2, -1)
    index = self.relative_position_index.view(-1)
    bias = self.relative_position_bias_table[index].view(n, n, -1).permute(2, 0, 1)
    attn = attn + bias.unsqueeze(0)
    if mask is not None:
      nw = mask.shape[0]
      attn = attn.view(b // nw, nw, self.heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
      attn = attn.view(-1, self.heads, n, n)
    attn = attn.softmax(-1)
    return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class ShiftWindowMSA(nn.Module):

  def __init__(self, dim, heads, window, shift, drop_path):
    super().__init__()
    self.window, self.shift = window, shift
    self.w_msa = WindowMSA(dim, heads, window)
    self.drop = DropPath(drop_path)

  def forward(self, x, hw):
    b, _, c = x.shape
    h, w = hw
    ws = self.window
    x = x.view(b, h, w, c)
    ph, pw = (ws - h % ws) % ws, (ws - w % ws) % ws
    x = F.pad(x, (0, 0, 0, pw, 0, ph))
    hp, wp = x.shape[1], x.shape[2]
    mask = None
    if self.shift:
      x = torch.roll(x, (-self.shift, -self.shift), (1, 2))
      img = torch.zeros((1, hp, wp, 1), device=x.device)
      cnt = 0
      for hs in (slice(0, -ws), slice(-ws, -self.shift), slice(-self.shift, None)):
        for wsl in (slice(0, -ws), slice(-ws, -self.shift), slice(-self.shift, None)):
          img[:, hs, wsl, :] = cnt
          cnt += 1
      mw = self._partition(img).view(-1, ws * ws)
      mask = mw.unsqueeze(1) - mw.unsqueeze(2)
      mask = mask.masked_fill(mask != 0, -100.).masked_fill(mask == 0, 0.)
    win = self._partition(x).view(-1, ws * ws, c)
    out = self.w_msa(win, mask).view(-1, ws, ws, c)
    x = out.view(b, hp // ws, wp // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
    if self.shift:
      x = torch.roll(x, (self.shift, self.shift), (1, 2))
    x = x[:, :h, :w, :].contiguous().view(b, h * w, c)
    return self.drop(x)

  def _partition(self, x):
    b, h, w, c = x.shape
    ws = self.window
    x = x.view(b, h // ws, ws, w // ws, ws, c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, c)


class FFN(nn.Module):

  def __init__(self, dim, drop_path):
    super().__init__()
    self.layers = nn.Sequential(nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Dropout(0.)),
                                nn.Linear(4 * dim, dim), nn.Dropout(0.))
    self.drop = DropPath(drop_path)

  def forward(self, x, identity):
    return identity + self.drop(self.layers(x))


class SwinBlock(nn.Module):

  def __init__(self, dim, heads, window, shift, drop_path):
    super().__init__()
    self.norm1 = nn.LayerNorm(dim)
    self.attn = ShiftWindowMSA(dim, heads, window, shift, drop_path)
    self.norm2 = nn.LayerNorm(dim)
    self.ffn = FFN(dim, drop_path)

  def forward(self, x, hw):
    x = x + self.attn(self.norm1(x), hw)
    return self.ffn(self.norm2(x), identity=x)


class PatchMerging(nn.Module):

  def __init__(self, dim):
    super().__init__()
    self.sampler = nn.Unfold(2, stride=2)
    self.norm = nn.LayerNorm(4 * dim)
    self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

  def forward(self, x, hw):
    b, _, c = x.shape
    h, w = hw
    x = x.view(b, h, w, c).permute(0, 3, 1, 2)
    x = F.pad(x, (0, w % 2, 0, h % 2))
    x = self.sampler(x).transpose(1, 2)
    return self.reduction(self.norm(x)), ((h + 1) // 2, (w + 1) // 2)


class PatchEmbed(nn.Module):

  def __init__(self, embed):
    super().__init__()
    self.projection = nn.Conv2d(3, embed, 4, 4)
    self.norm = nn.LayerNorm(embed)

  def forward(self, x):
    x = self.projection(x)
    hw = x.shape[2:]
    return self.norm(x.flatten(2).transpose(1, 2)), hw


class Stage(nn.Module):

  def __init__(self, dim, depth, heads, window, drop_paths, downsample):
    super().__init__()
    self.blocks = nn.ModuleList(
        SwinBlock(dim, heads, window, (window // 2) * (j % 2), drop_paths[j])
        for j in range(depth))
    self.downsample = PatchMerging(dim) if downsample else None

  def forward(self, x, hw):
    for blk in self.blocks:
      x = blk(x, hw)
    if self.downsample is None:
      return x, hw, x, hw
    down, down_hw = self.downsample(x, hw)
    return down, down_hw, x, hw


class Swin(nn.Module):

  def __init__(self, embed=96, depths=(2, 2, 6, 2), heads=(3, 6, 12, 24), window=7,
               drop_path_rate=0.1):
    super().__init__()
    self.patch_embed = PatchEmbed(embed)
    dpr = np.linspace(0, drop_path_rate, sum(depths)).tolist()
    self.stages = nn.ModuleList()
    self.dims = [embed * 2 ** i for i in range(len(depths))]
    for i, (d, h) in enumerate(zip(depths, heads)):
      k = sum(depths[:i])
      self.stages.append(Stage(self.dims[i], d, h, window, dpr[k:k + d], i < len(depths) - 1))
      self.add_module(f'norm{i}', nn.LayerNorm(self.dims[i]))

  def forward(self, x):
    x, hw = self.patch_embed(x)
    outs = []
    for i, stage in enumerate(self.stages):
      x, next_hw, out, out_hw = stage(x, hw)
      o = getattr(self, f'norm{i}')(out)
      outs.append(o.view(-1, *out_hw, self.dims[i]).permute(0, 3, 1, 2).contiguous())
      hw = next_hw
    return outs


class Decoder(nn.Module):

  def __init__(self, dims, c=96):
    super().__init__()
    self.linears = nn.ModuleList(nn.Linear(d, c) for d in dims)
    self.linear_fuse = nn.Sequential(nn.Conv2d(4 * c, c, 1), nn.BatchNorm2d(c), nn.LeakyReLU())

  def forward(self, feats):
    size = feats[0].shape[2:]
    outs = []
    for lin, f in zip(self.linears, feats):
      n, _, h, w = f.shape
      o = lin(f.flatten(2).transpose(1, 2)).permute(0, 2, 1).reshape(n, -1, h, w)
      outs.append(F.interpolate(o, size=size, mode='bilinear', align_corners=False))
    return self.linear_fuse(torch.cat(outs, 1))


class Net(nn.Module):

  def __init__(self, classes=21):
    super().__init__()
    self.backbone = Swin()
    self.decoder = Decoder(self.backbone.dims)
    self.head = nn.Sequential(nn.ConvTranspose2d(96, 48, 2, 2), nn.ConvTranspose2d(48, 24, 2, 2),
                              nn.Conv2d(24, classes, 1))

  def forward(self, x):
    out = self.head(self.decoder(self.backbone(x)))
    return F.interpolate(out, size=x.shape[2:], mode='bilinear', align_corners=False)


def swin_step_runner(resolution, batch=8):
  """(run, net): one warmed-up local training step of the released model."""
  torch.manual_seed(0)
  net = Net().train()
  opt = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=1e-4)
  x = torch.randn(batch, 3, resolution, resolution)
  y = torch.randint(0, 21, (batch, resolution, resolution))

  def run():
    opt.zero_grad()
    loss = F.cross_entropy(net(x), y, ignore_index=255)
    loss.backward()
    opt.step()

  run()
  return run, net


def bench_swin_step(resolution, batch=8, repeats=3):
  run, net = swin_step_runner(resolution, batch)
  dt = _timeit(run, repeats)
  return {'resolution': resolution, 'batch': batch, 'step_s': dt, 'images_per_s': batch / dt,
          'backbone_params': sum(p.numel() for p in net.backbone.parameters())}


# --------------------------------------------------------------------- ViT-B/32 + LoRA step

class LoRALinear(nn.Module):
  """A frozen Linear plus (alpha / r) B A x, A Kaiming-uniform, B = 0 (peft's LoRA)."""

  def __init__(self, base, rank, alpha):
    super().__init__()
    self.base = base
    self.a = nn.Parameter(torch.empty(rank, base.in_features))
    nn.init.kaiming_uniform_(self.a, a=5 ** 0.5)
    self.b = nn.Parameter(torch.zeros(base.out_features, rank))
    self.scale = alpha / rank

  def forward(self, x):
    return self.base(x) + self.scale * F.linear(F.linear(x, self.a), self.b)


class ViTBlock(nn.Module):
  """timm's pre-LN block with q, k, v as separate projections (LoRA on q and v)."""

  def __init__(self, dim, heads, mlp, rank):
    super().__init__()
    self.heads = heads
    self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
    self.q = LoRALinear(nn.Linear(dim, dim), rank, rank)
    self.k = nn.Linear(dim, dim)
    self.v = LoRALinear(nn.Linear(dim, dim), rank, rank)
    self.proj = nn.Linear(dim, dim)
    self.fc1, self.fc2 = nn.Linear(dim, mlp), nn.Linear(mlp, dim)

  def forward(self, x):
    b, n, d = x.shape
    h = self.norm1(x)
    split = lambda t: t.view(b, n, self.heads, d // self.heads).transpose(1, 2)
    a = F.scaled_dot_product_attention(split(self.q(h)), split(self.k(h)), split(self.v(h)))
    x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
    return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViTLoRA(nn.Module):
  """ViT-B/32 at 224 (timm layout) with LoRA rank r on q/v and a linear head on [CLS]."""

  def __init__(self, classes=10, rank=16, dim=768, depth=12, heads=12, mlp=3072, patch=32,
               size=224):
    super().__init__()
    self.patch = nn.Conv2d(3, dim, patch, patch)
    self.cls = nn.Parameter(torch.zeros(1, 1, dim))
    self.pos = nn.Parameter(torch.randn(1, 1 + (size // patch) ** 2, dim) * .02)
    self.blocks = nn.ModuleList(ViTBlock(dim, heads, mlp, rank) for _ in range(depth))
    self.norm = nn.LayerNorm(dim, eps=1e-6)
    self.head = nn.Linear(dim, classes)

  def forward(self, x):
    x = self.patch(x).flatten(2).transpose(1, 2)
    x = torch.cat([self.cls.expand(len(x), -1, -1), x], 1) + self.pos
    for blk in self.blocks:
      x = blk(x)
    return self.head(self.norm(x)[:, 0])


def vit_lora_runner(batch=32, size=224):
  """(run, net): one warmed-up step of LoRA + head training (backbone frozen), AdamW 1e-3."""
  torch.manual_seed(0)
  net = ViTLoRA(size=size).train()
  train = [p for n, p in net.named_parameters() if n.endswith(('.a', '.b')) or
           n.startswith('head.')]
  for p in net.parameters():
    p.requires_grad_(False)
  for p in train:
    p.requires_grad_(True)
  opt = torch.optim.AdamW(train, lr=1e-3, weight_decay=0.)
  x = torch.randn(batch, 3, size, size)
  y = torch.randint(0, 10, (batch,))

  def run():
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()

  run()
  return run, net


# ----------------------------------------------------------------------- FedHCA2 aggregation

def get_ca_delta(flat_deltas, alpha=0.4, rescale=1):
  """The released CAGrad dual: Gram on the vectors, SLSQP on the host."""
  from scipy.optimize import minimize
  n = len(flat_deltas)
  grads = torch.stack(flat_deltas).t()  # d x N
  gg_np = grads.t().mm(grads).numpy().astype(np.float64)
  x_start = np.ones(n) / n
  b = x_start.copy()
  c = (gg_np.mean() + 1e-8) ** 0.5 * alpha + 1e-8
  obj = lambda x: x @ gg_np @ b + c * np.sqrt(x @ gg_np @ x + 1e-8)
  res = minimize(obj, x_start, bounds=[(0, 1)] * n,
                 constraints={'type': 'eq', 'fun': lambda x: 1 - x.sum()})
  ww = torch.tensor(res.x, dtype=torch.float32)
  gw = (grads * ww.view(1, -1)).sum(1)
  lmbda = c / (gw.norm() + 1e-8)
  g = grads.mean(1) + lmbda * gw
  return g / (1 + alpha ** 2) if rescale else g


class HyperCrossAttention(nn.Module):

  def __init__(self, layer_names, k, init=0.1):
    super().__init__()
    self.layer_names = layer_names
    self.beta = nn.ParameterList(nn.Parameter(torch.full((k,), init)) for _ in layer_names)

  def forward(self, last, deltas):
    """last, deltas: per decoder a dict name -> tensor. Returns the new decoder dicts."""
    k = len(deltas)
    new = [dict() for _ in range(k)]
    for li, lname in enumerate(self.layer_names):
      beta = self.beta[li].clamp(0, 1)
      for key in deltas[0]:
        if lname not in key:
          continue
        flat = torch.stack([d[key].flatten() for d in deltas])
        attn = (flat @ flat.t() / flat.shape[1] ** 0.5).softmax(1)
        cross = attn @ flat
        for i in range(k):
          new[i][key] = last[i][key] + deltas[i][key] + beta[i] * cross[i].view_as(deltas[i][key])
    return new


class HyperAggWeight(nn.Module):

  def __init__(self, n, init=0.1):
    super().__init__()
    self.alpha = nn.Parameter(torch.full((n,), init))

  def forward(self, last, deltas_homo, ca):
    a = self.alpha.clamp(0, 1)
    return [{k: last[i][k] + deltas_homo[i][k] + a[i] * ca[k] for k in last[i]}
            for i in range(len(last))]


def hca2_runner(num_clients=6, num_decoders=9):
  """(run, sizes): one round of the released server step, Swin-T-sized, warmed up."""
  torch.manual_seed(0)
  enc_shapes = {n: p.shape for n, p in Swin().named_parameters()}
  dec_shapes = {n: p.shape for n, p in Decoder([96, 192, 384, 768]).named_parameters()}
  layer_names = ['linears.0', 'linears.1', 'linears.2', 'linears.3', 'linear_fuse.0',
                 'linear_fuse.1']
  rnd = lambda shapes, s: {n: torch.randn(sh) * s for n, sh in shapes.items()}
  enc_last = [rnd(enc_shapes, 0.02) for _ in range(num_clients)]
  dec_last = [rnd(dec_shapes, 0.02) for _ in range(num_decoders)]
  enc_local = [{n: v + 1e-3 * torch.randn_like(v) for n, v in e.items()} for e in enc_last]
  dec_local = [{n: v + 1e-3 * torch.randn_like(v) for n, v in d.items()} for d in dec_last]
  # Scenario 1 (one client per dataset and task set): no homo groups, as in bench.py.
  homo = [[i] for i in range(num_clients)]
  hyper_enc = HyperAggWeight(num_clients)
  hyper_dec = HyperCrossAttention(layer_names, num_decoders)
  opt = torch.optim.SGD(list(hyper_enc.parameters()) + list(hyper_dec.parameters()), lr=0.01,
                        momentum=0.9, weight_decay=1e-4)
  state = {}

  def one_round():
    # update_hyperweight: backward through last round's retained graph.
    if 'enc_out' in state:
      opt.zero_grad()
      outs, diffs = [], []
      for i in range(num_clients):
        for n in enc_shapes:
          outs.append(state['enc_out'][i][n])
          diffs.append(enc_last[i][n] - enc_local[i][n])
      for i in range(num_decoders):
        for n in dec_shapes:
          outs.append(state['dec_out'][i][n])
          diffs.append(dec_last[i][n] - dec_local[i][n])
      torch.autograd.backward(outs, diffs)
      opt.step()
    # aggregate(): encoders.
    with torch.no_grad():
      enc_delta = [{n: enc_local[i][n] - enc_last[i][n] for n in enc_shapes}
                   for i in range(num_clients)]
      flat = [torch.cat([d[n].flatten() for n in enc_shapes]) for d in enc_delta]
      g = get_ca_delta(flat)
      ca, off = {}, 0
      for n, sh in enc_shapes.items():
        size = int(np.prod(sh))
        ca[n] = g[off:off + size].view(sh)
        off += size
      homo_delta = list(enc_delta)
      for grp in homo:
        if len(grp) > 1:
          avg = {n: sum(enc_delta[i][n] for i in grp) / len(grp) for n in enc_shapes}
          for i in grp:
            homo_delta[i] = avg
      dec_delta = [{n: dec_local[i][n] - dec_last[i][n] for n in dec_shapes}
                   for i in range(num_decoders)]
    state['enc_out'] = hyper_enc(enc_last, homo_delta, ca)
    state['dec_out'] = hyper_dec(dec_last, dec_delta)

  one_round()  # the first round has no hypergradient step; time the steady state
  one_round()
  return one_round, {'num_clients': num_clients, 'num_decoders': num_decoders,
                     'encoder_params': sum(int(np.prod(s)) for s in enc_shapes.values()),
                     'decoder_params': sum(int(np.prod(s)) for s in dec_shapes.values())}


def bench_hca2(num_clients=6, num_decoders=9, repeats=3):
  run, sizes = hca2_runner(num_clients, num_decoders)
  return {**sizes, 'round_s': _timeit(run, repeats)}


def dump_swin(path, sizes=((512, 512), (448, 576)), seed=0):
  """Swin-T in eval mode (torch's random init, vectors perturbed so that norm scales and
  biases are not 1/0, a random relative position bias), its state dict, and its four stage
  outputs on a random image of each size, into one .npz: `sd/<name>`, `x/<h>x<w>`,
  `out<i>/<h>x<w>` (NCHW)."""
  torch.manual_seed(seed)
  net = Swin().eval()
  with torch.no_grad():
    for name, p in net.named_parameters():
      if name.endswith('relative_position_bias_table'):
        p.normal_(0., 0.5)  # zeros at init: make the bias and its indexing matter
      elif p.ndim == 1:
        p.add_(0.1 * torch.randn_like(p))  # norm scales around 1, non-zero biases
  arrays = {f'sd/{k}': v.numpy() for k, v in net.state_dict().items()}
  for h, w in sizes:
    x = torch.randn(1, 3, h, w)
    with torch.no_grad():
      outs = net(x)
    arrays[f'x/{h}x{w}'] = x.numpy()
    for i, o in enumerate(outs):
      arrays[f'out{i}/{h}x{w}'] = o.numpy()
  np.savez(path, **arrays)


SERVE = {
    'swin_t_128': lambda: swin_step_runner(128)[0],
    'swin_t_224': lambda: swin_step_runner(224)[0],
    'hca2': lambda: hca2_runner()[0],
    'vit_lora': lambda: vit_lora_runner()[0],
}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--only', default='all', choices=['swin', 'hca2', 'all'],
                 help='workloads to time: swin (Swin-T local step at 128 and 224), hca2 '
                      '(FedHCA2 aggregation) or all (default: %(default)s)')
  p.add_argument('--repeats', type=int, default=3,
                 help='timed calls per workload; the fastest is reported (default: %(default)s)')
  p.add_argument('--threads', type=int, default=None,
                 help='torch intra-op threads (default: torch\'s choice, the core count)')
  p.add_argument('--serve', default='', choices=['', *SERVE],
                 help='build one workload, print "ready", then time one call per stdin line '
                      '(the worker side of scripts/compare_torch.py)')
  p.add_argument('--dump_swin', default='',
                 help='write a randomised Swin-T state dict and its stage outputs to this '
                      '.npz (for scripts/compare_torch.py --check_swin) and exit')
  a = p.parse_args(argv)
  if torch is None:
    raise SystemExit('error: scripts/bench_torch.py needs torch (pip install torch, CPU wheel)')
  if a.dump_swin:
    return dump_swin(a.dump_swin)
  if a.threads:
    torch.set_num_threads(a.threads)
  if a.serve:
    return serve(SERVE[a.serve])
  results = {'torch': torch.__version__, 'threads': torch.get_num_threads()}
  if a.only in ('hca2', 'all'):
    results['hca2'] = bench_hca2(repeats=a.repeats)
  if a.only in ('swin', 'all'):
    for res in (128, 224):
      results[f'swin_t_{res}'] = bench_swin_step(res, repeats=a.repeats)
  print(json.dumps(results, indent=1))


if __name__ == '__main__':
  main()
