"""An experiment for the family issue: distil the target's MTP module on a mix of the training text and the target's own
text (continuations of training windows, greedy and at T = 1), and count first guesses kept before and after.

    python tools/mtp_own_text.py [--dir models/cpu] [--steps 1200] [--share 0.5] [--texts 768] [--sampled 3]
                                 [--top1 0] [--blocks 1] [--threads 1] [--out mtp_own_text.pt]

The module alone is trained, toward the target's own law of the token after next (the loss of `train.mtp_distill_losses`),
`share` of each batch of 16 windows from the pool of the target's texts (`texts` of them, one batch of 32 in `sampled`
at T = 1, the rest greedy); the trunk, embedding and head stay frozen, so the target's text is unchanged. First guesses
kept are counted as tools/family_check.py counts them (8 benchmark prompts x 200 tokens, k = 1, batch 1). The module's
weights go to --out; nothing in DIR is changed. Counts, not timings. `--top1 W` adds W times the cross-entropy of the
module on the target's most likely token after next to the KL: what a greedy first guess must match. `--blocks N` gives
the module N blocks: its trained block first, then N - 1 new ones that start as the identity (their two output
projections zero), each with its own layer of the module's cache; the capacity experiment (the library's module has one).
"""
import argparse, copy, time
from pathlib import Path
import torch
import torch.nn.functional as F
from smallem_spec.train import load_checkpoint, mtp_distill_losses, train_batch, TrainConfig, lr_at, evaluate
from smallem_spec.corpus import load_tokens, validation_prompts
from smallem_spec.generate import generate
from smallem_spec.mtp import MTPProposer
from smallem_spec.cache import PagedKVCache
from family_check import first_guess

def top1_losses(model, x, w:float):
    "`mtp_distill_losses`'s KL(p || q) of the token after next, plus w times the module's cross-entropy on p's most likely token."
    inp = x[:, :-1]
    with torch.no_grad(): logits, h = model(inp, return_hidden=True)
    ml, _ = model.mtp_forward(h[:, :-1], inp[:, 1:])
    lq = F.log_softmax(ml.float(), -1).flatten(0, 1); lp = F.log_softmax(logits[:, 1:].float(), -1).flatten(0, 1)
    return F.kl_div(lq, lp, log_target=True, reduction='batchmean') + w * F.nll_loss(lq, lp.argmax(-1))

class Blocks(torch.nn.Module):
    "Blocks run in turn where the module has one; block i reads and writes layer `layer + i` of the cache."
    def __init__(self, blocks): super().__init__(); self.blocks = torch.nn.ModuleList(blocks)
    def forward(self, x, cos, sin, cache=None, layer=0, plan=None):
        for i, b in enumerate(self.blocks): x = b(x, cos, sin, cache, layer + i, plan)
        return x

def more_blocks(model, n:int):
    "Give `model`'s MTP module n blocks (the trained one first, the others the identity) and a cache of n layers for it."
    first = model.mtp.block; extra = [copy.deepcopy(first) for _ in range(n - 1)]
    for b in extra:
        for lin in (b.attn.wo, b.ffn.w2): torch.nn.init.zeros_(lin.weight)
        for lin in (b.attn.wqkv, b.ffn.w13): torch.nn.init.normal_(lin.weight, std=0.02)
    model.mtp.block = Blocks([first] + extra); new = model.new_cache
    def new_cache(*args, mtp=False, **kw):
        c = new(*args, mtp=mtp, **kw)
        return PagedKVCache(n, c.k.shape[2], c.k.shape[3], c.n_pages, c.page_size, c.max_len, device=c.device, dtype=c.k.dtype) if mtp else c
    model.new_cache = new_cache

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--dir', default='models/cpu'); ap.add_argument('--steps', type=int, default=1200)
    ap.add_argument('--share', type=float, default=0.5); ap.add_argument('--texts', type=int, default=768)
    ap.add_argument('--sampled', type=int, default=3); ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--top1', type=float, default=0.0); ap.add_argument('--blocks', type=int, default=1)
    ap.add_argument('--out', default='mtp_own_text.pt')
    a = ap.parse_args(argv); torch.set_num_threads(a.threads); t0 = time.time()
    model = load_checkpoint(Path(a.dir), 'target', 'cpu').eval(); data = load_tokens('cpu'); prompts = validation_prompts('cpu', 8)
    kept = lambda: {T: round(first_guess(model, lambda: MTPProposer(model), prompts, 200, T), 4) for T in (0.0, 1.0)}
    print('first guesses kept before', kept(), flush=True)
    if a.blocks > 1: more_blocks(model, a.blocks); print(f'module of {a.blocks} blocks, {sum(p.numel() for p in model.mtp.parameters()):,} parameters; kept', kept(), flush=True)
    g, pool = torch.Generator().manual_seed(7), []
    for b in range(a.texts // 32):
        ix = torch.randint(0, len(data.train) - 40, (32,), generator=g).tolist()
        ps = [data.train[i:i + 33].tolist() for i in ix]
        outs = generate(model, ps, 224, temperature=1.0 if b % a.sampled == a.sampled - 1 else 0.0, generator=g)
        pool += [p + o for p, o in zip(ps, outs) if len(o) == 224]
    pool = torch.tensor(pool); print(f'{len(pool)} texts of the target, {time.time() - t0:.0f} s', flush=True)
    tc = TrainConfig(steps=a.steps, batch_size=16, seq_len=256, lr=5e-4, warmup=20, seed=1)
    params = list(model.mtp.parameters()); mine = {id(p) for p in params}
    for p in model.parameters():
        if id(p) not in mine: p.requires_grad_(False)
    opt = torch.optim.AdamW([{'params': [p for p in params if p.dim() >= 2], 'weight_decay': 0.1},
                             {'params': [p for p in params if p.dim() < 2], 'weight_decay': 0.}], lr=tc.lr, betas=(0.9, 0.95))
    model.eval(); model.mtp.train(); own = int(16 * a.share)
    for step in range(a.steps):
        for grp in opt.param_groups: grp['lr'] = lr_at(step, tc)
        x = train_batch(data, tc, g, 'cpu')
        if own: x = torch.cat([x[:16 - own], pool[torch.randint(0, len(pool), (own,), generator=g)]])
        kl = top1_losses(model, x, a.top1) if a.top1 else mtp_distill_losses(model, x)[1]; opt.zero_grad(); kl.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
        if step % 100 == 99: print(step + 1, round(kl.item(), 4), f'{time.time() - t0:.0f} s', flush=True)
    model.eval(); ev = evaluate(model, data, windows=64)
    print('first guesses kept after', kept(), {k: round(ev[k], 4) for k in ('nats_per_byte', 'mtp_acc', 'mtp_agree')}, f'{time.time() - t0:.0f} s', flush=True)
    torch.save(model.mtp.state_dict(), a.out); print('module written to', a.out)

if __name__ == '__main__': main()
