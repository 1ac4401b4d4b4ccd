#!/usr/bin/env python3
"""Independent reference values for oxalign-rlhf's tests.

Each formula is written from its published definition (GAE as the explicit (γλ)-weighted sum of
TD errors, GRPO/RLOO/REINFORCE++ from their papers, PPO/value/DPO/IPO/Bradley–Terry losses with
torch autograd for gradients, KL-as-loss gradients, GSPO and CISPO from their papers, rollout correction
(sequence masking, IcePop), on-policy distillation advantages,
torch.optim.AdamW, torch.nn.utils.clip_grad_norm_ and the HF
transformers cosine scheduler), on small fixed random inputs, and written to
rlhf/tests/fixtures/reference.json. Usage: python3 tools/rlhf_reference.py [output.json]
"""

import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
RNG = np.random.default_rng(20250611)


def lst(a):
    return np.asarray(a, dtype=np.float64).tolist()


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------

B, T = 4, 7
# Left-padded prompts, right padding, and one row with a masked gap (tool output) inside.
MASK = np.array(
    [
        [0, 0, 1, 1, 1, 1, 0],
        [0, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 1, 0, 1, 1],
        [1, 1, 0, 0, 0, 0, 0],
    ],
    dtype=np.float64,
)


def randn(*shape, scale=1.0):
    return RNG.standard_normal(shape) * scale


def response_positions(mask_row):
    return [i for i, m in enumerate(mask_row) if m != 0]


# --------------------------------------------------------------------------------------------
# advantages
# --------------------------------------------------------------------------------------------


def gae_reference(rewards, values, mask, gamma, lam, last_value, truncated):
    """Schulman et al. 2016, eq. 16: A_t = sum_l (gamma*lam)^l delta_{t+l} over the response."""
    adv = np.zeros_like(rewards)
    ret = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        pos = response_positions(mask[b])
        n = len(pos)
        v = [values[b, p] for p in pos]
        r = [rewards[b, p] for p in pos]
        v_after = last_value[b] if truncated[b] else 0.0
        deltas = []
        for k in range(n):
            v_next = v[k + 1] if k + 1 < n else v_after
            deltas.append(r[k] + gamma * v_next - v[k])
        for k in range(n):
            a = sum((gamma * lam) ** l * deltas[k + l] for l in range(n - k))
            adv[b, pos[k]] = a
            ret[b, pos[k]] = a + v[k]
    return adv, ret


def gae_cases():
    cases = []
    for gamma, lam, trunc in [(1.0, 0.95, False), (0.99, 0.9, True), (0.9, 0.0, True), (1.0, 1.0, False)]:
        rewards = randn(B, T)
        values = randn(B, T)
        last_value = randn(B)
        truncated = np.array([1.0, 0.0, 1.0, 1.0]) if trunc else np.zeros(B)
        adv, ret = gae_reference(rewards, values, MASK, gamma, lam, last_value, truncated)
        cases.append(
            dict(
                gamma=gamma,
                lam=lam,
                bootstrap=trunc,
                rewards=lst(rewards),
                values=lst(values),
                mask=lst(MASK),
                last_value=lst(last_value),
                truncated=lst(truncated),
                advantages=lst(adv),
                returns=lst(ret),
            )
        )
    return cases


def group_cases():
    G = 4
    scores = RNG.integers(0, 3, size=3 * G).astype(np.float64) + randn(3 * G, scale=0.1)
    scores[8:12] = 1.0  # a group with identical scores: std 0
    grpo = np.zeros_like(scores)
    dr = np.zeros_like(scores)
    rloo = np.zeros_like(scores)
    eps = 1e-6
    for g in range(3):
        s = scores[g * G : (g + 1) * G]
        grpo[g * G : (g + 1) * G] = (s - s.mean()) / (s.std(ddof=1) + eps)
        dr[g * G : (g + 1) * G] = s - s.mean()
        for i in range(G):
            others = [s[j] for j in range(G) if j != i]
            rloo[g * G + i] = s[i] - sum(others) / len(others)
    return dict(group_size=G, eps=eps, scores=lst(scores), grpo=lst(grpo), dr_grpo=lst(dr), rloo=lst(rloo))


def masked_whiten_reference(x, mask, shift_mean, eps):
    sel = x[mask != 0]
    mean = sel.mean()
    var = sel.var(ddof=1)
    w = (x - mean) / math.sqrt(var + eps)
    if not shift_mean:
        w = w + mean
    return np.where(mask != 0, w, 0.0)


def reinforce_pp_case():
    gamma = 0.95
    rewards = randn(B, T, scale=0.5)
    ret = np.zeros_like(rewards)
    for b in range(B):
        pos = response_positions(MASK[b])
        for k in range(len(pos)):
            ret[b, pos[k]] = sum(gamma ** (j - k) * rewards[b, pos[j]] for j in range(k, len(pos)))
    adv = masked_whiten_reference(ret, MASK, True, 1e-8)
    return dict(gamma=gamma, rewards=lst(rewards), mask=lst(MASK), returns=lst(ret), advantages=lst(adv))


def whiten_cases():
    x = randn(B, T, scale=2.0) + 1.5
    out = []
    for shift in (True, False):
        out.append(dict(shift_mean=shift, eps=1e-8, x=lst(x), mask=lst(MASK), out=lst(masked_whiten_reference(x, MASK, shift, 1e-8))))
    return out


# --------------------------------------------------------------------------------------------
# losses (torch autograd for gradients)
# --------------------------------------------------------------------------------------------


def agg_torch(loss, mask, mode):
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum()
    rows = mask.sum(-1) > 0
    if mode == "seq-mean-token-sum":
        per_seq = (loss * mask).sum(-1)
    else:
        per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq[rows].mean()


def ppo_cases():
    cases = []
    mask = torch.tensor(MASK)
    configs = [
        dict(clip_low=0.2, clip_high=0.2, dual_clip=None, agg="token-mean", tis=None),
        dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg="seq-mean-token-sum", tis=None),
        dict(clip_low=0.1, clip_high=0.3, dual_clip=None, agg="seq-mean-token-mean", tis=2.0),
    ]
    for cfg in configs:
        old = torch.tensor(randn(B, T, scale=0.5) - 1.0)
        # Mix of small and large policy moves so clipping and the dual clip trigger.
        logp0 = old + torch.tensor(randn(B, T, scale=0.6))
        logp0[0, 3] = old[0, 3] + 1.6  # ratio ~ 5 (> c = 3)
        adv = torch.tensor(randn(B, T))
        adv[0, 3] = -1.3
        rollout = old + torch.tensor(randn(B, T, scale=0.5))
        logp = logp0.clone().requires_grad_(True)
        ratio = torch.exp(logp - old)
        # Schulman et al. 2017, eq. 7 (as a loss) with separate low/high clip.
        surr = torch.min(ratio * adv, torch.clamp(ratio, 1 - cfg["clip_low"], 1 + cfg["clip_high"]) * adv)
        loss_tok = -surr
        clipfrac_ind = (-adv * torch.clamp(ratio, 1 - cfg["clip_low"], 1 + cfg["clip_high"]) > -adv * ratio).double()
        dual_ind = torch.zeros_like(adv)
        if cfg["dual_clip"] is not None:
            # Ye et al. 2020 dual clip: for A < 0, max(min(r A, clip(r) A), c A).
            dual = torch.max(surr, cfg["dual_clip"] * adv)
            dual_ind = ((adv < 0) & (cfg["dual_clip"] * adv > surr)).double()
            loss_tok = torch.where(adv < 0, -dual, -surr)
        weights = None
        if cfg["tis"] is not None:
            weights = torch.clamp(torch.exp(old - rollout), max=cfg["tis"])
            loss_tok = loss_tok * weights
        loss = agg_torch(loss_tok, mask, cfg["agg"])
        loss.backward()
        n = mask.sum()
        cases.append(
            dict(
                config=cfg,
                logprobs=lst(logp0),
                old_logprobs=lst(old),
                advantages=lst(adv),
                rollout_logprobs=lst(rollout),
                mask=lst(MASK),
                loss=float(loss.detach()),
                grad=lst(logp.grad * mask),
                clip_frac=float((clipfrac_ind * mask).sum() / n),
                dual_clip_frac=float((dual_ind * mask).sum() / n),
                approx_kl=float(((old - logp0) * mask).sum() / n),
            )
        )
    return cases


def value_cases():
    cases = []
    mask = torch.tensor(MASK)
    for clip, agg in [(0.2, "token-mean"), (None, "seq-mean-token-mean")]:
        old = torch.tensor(randn(B, T))
        v0 = old + torch.tensor(randn(B, T, scale=0.4))
        ret = torch.tensor(randn(B, T))
        v = v0.clone().requires_grad_(True)
        l1 = (v - ret) ** 2
        if clip is None:
            tok = 0.5 * l1
            frac = 0.0
        else:
            v_clip = old + torch.clamp(v - old, -clip, clip)
            l2 = (v_clip - ret) ** 2
            tok = 0.5 * torch.max(l1, l2)
            frac = float(((l2 > l1).double() * mask).sum() / mask.sum())
        loss = agg_torch(tok, mask, agg)
        loss.backward()
        cases.append(
            dict(clip=clip, agg=agg, values=lst(v0), old_values=lst(old), returns=lst(ret), mask=lst(MASK),
                 loss=float(loss.detach()), grad=lst(v.grad * mask), clip_frac=frac)
        )
    return cases


def entropy_case():
    ent = np.abs(randn(B, T)) * 2.0
    m = MASK
    token_mean = (ent * m).sum() / m.sum()
    return dict(entropy=lst(ent), mask=lst(m), coef=0.01, loss=-0.01 * token_mean, entropy_mean=token_mean)


def kl_case():
    logp = randn(B, T, scale=0.7) - 1.5
    ref = logp + randn(B, T, scale=0.4)
    d = logp - ref
    k1 = d
    k2 = 0.5 * d ** 2
    # Schulman 2020: k3 = (r - 1) - log r with r = q/p = exp(logq - logp).
    r = np.exp(ref - logp)
    k3 = (r - 1) - np.log(r)
    scores = randn(B)
    beta = 0.05
    shaped = {}
    for name, k in (("k1", k1), ("k2", k2), ("k3", k3)):
        rew = np.where(MASK != 0, -beta * k, 0.0)
        for b in range(B):
            last = response_positions(MASK[b])[-1]
            rew[b, last] += scores[b]
        shaped[name] = lst(rew)
    km = lambda k: lst(np.where(MASK != 0, k, 0.0))
    seq_mean = float(np.mean([(k3[b] * MASK[b]).sum() for b in range(B)]))
    return dict(logprobs=lst(logp), ref_logprobs=lst(ref), mask=lst(MASK), scores=lst(scores), beta=beta,
                k1=km(k1), k2=km(k2), k3=km(k3), shaped=shaped, k3_seq_mean=seq_mean,
                k3_token_mean=float((k3 * MASK).sum() / MASK.sum()))


def tis_case():
    old = randn(B, T, scale=0.5) - 1.0
    rollout = old + randn(B, T, scale=0.6)
    cap = 1.5
    w = np.minimum(np.exp(old - rollout), cap)
    sel = MASK != 0
    diff = np.abs(old - rollout)[sel]
    return dict(trainer_old_logprobs=lst(old), rollout_logprobs=lst(rollout), mask=lst(MASK), cap=cap,
                weights=lst(np.where(sel, w, 0.0)), mismatch_abs_mean=float(diff.mean()),
                mismatch_abs_max=float(diff.max()), weight_mean=float(w[sel].mean()),
                truncated_frac=float((np.exp(old - rollout)[sel] > cap).mean()))


def dpo_cases():
    n = 5
    pc0 = torch.tensor(randn(n, scale=3.0) - 40)
    pr0 = torch.tensor(randn(n, scale=3.0) - 42)
    rc = pc0 + torch.tensor(randn(n))
    rr = pr0 + torch.tensor(randn(n))
    cases = []
    for kind, beta, eps in [("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.1), ("ipo", 0.1, 0.0)]:
        pc = pc0.clone().requires_grad_(True)
        pr = pr0.clone().requires_grad_(True)
        # Rafailov et al. 2023 eq. 7; cDPO: label-smoothed; Azar et al. 2023 IPO eq. 17.
        h = (pc - rc) - (pr - rr)
        if kind == "sigmoid":
            loss = (-(1 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)).mean()
        else:
            loss = ((h - 1 / (2 * beta)) ** 2).mean()
        loss.backward()
        cr = beta * (pc0 - rc)
        rj = beta * (pr0 - rr)
        cases.append(dict(kind=kind, beta=beta, label_smoothing=eps, policy_chosen=lst(pc0), policy_rejected=lst(pr0),
                          reference_chosen=lst(rc), reference_rejected=lst(rr), loss=float(loss.detach()),
                          grad_chosen=lst(pc.grad), grad_rejected=lst(pr.grad),
                          reward_accuracy=float((cr > rj).double().mean()), reward_margin=float((cr - rj).mean()),
                          chosen_reward=float(cr.mean()), rejected_reward=float(rj.mean())))
    return cases


def bt_case():
    n = 6
    c0 = torch.tensor(randn(n))
    r0 = torch.tensor(randn(n))
    margin = torch.tensor(np.abs(randn(n)) * 0.5)
    out = []
    for use_margin in (False, True):
        c = c0.clone().requires_grad_(True)
        r = r0.clone().requires_grad_(True)
        diff = c - r - (margin if use_margin else 0.0)
        loss = -F.logsigmoid(diff).mean()
        loss.backward()
        out.append(dict(chosen=lst(c0), rejected=lst(r0), margin=lst(margin) if use_margin else None,
                        loss=float(loss.detach()), grad_chosen=lst(c.grad), accuracy=float((c0 > r0).double().mean()),
                        reward_margin=float((c0 - r0).mean())))
    return out


def sft_case():
    # log-softmax of random logits gathered at random targets: genuine token log-probs.
    logits = torch.tensor(randn(B, T, 11))
    targets = torch.tensor(RNG.integers(0, 11, size=(B, T)))
    logp = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    loss = F.cross_entropy(logits[MASK != 0], targets[MASK != 0])
    return dict(token_logprobs=lst(logp), mask=lst(MASK), loss=float(loss.detach()), num_tokens=int(MASK.sum()))


def adaptive_kl_case():
    # Ziegler et al. 2019, section 2.2.
    beta, target, horizon = 0.2, 6.0, 10000.0
    kls = [3.0, 5.5, 6.0, 9.0, 20.0, 0.5]
    n_steps = 256
    betas = []
    for kl in kls:
        e = float(np.clip(kl / target - 1, -0.2, 0.2))
        beta = beta * (1 + e * n_steps / horizon)
        betas.append(beta)
    return dict(init_beta=0.2, target=target, horizon=horizon, n_steps=n_steps, kls=kls, betas=betas)


# --------------------------------------------------------------------------------------------
# optimizer (torch as the reference)
# --------------------------------------------------------------------------------------------


def f32(a):
    return np.asarray(a, dtype=np.float32)


def adamw_case():
    names = ["model.layers.0.mlp.up_proj.weight", "model.layers.0.input_layernorm.weight", "score.bias"]
    shapes = [(3, 4), (4,), (2,)]
    init = [f32(randn(*s)) for s in shapes]
    params = [torch.nn.Parameter(torch.tensor(p, dtype=torch.float32)) for p in init]
    groups = [
        dict(name="decay", lr_scale=1.0, weight_decay=0.1),
        dict(name="no_decay", lr_scale=0.5, weight_decay=0.0),
    ]
    membership = [0, 1, 1]
    base_lr = 1e-2
    betas, eps = (0.9, 0.95), 1e-8
    opt = torch.optim.AdamW(
        [
            {"params": [params[0]], "lr": base_lr * 1.0, "weight_decay": 0.1},
            {"params": [params[1], params[2]], "lr": base_lr * 0.5, "weight_decay": 0.0},
        ],
        lr=base_lr, betas=betas, eps=eps, foreach=False,
    )
    steps = []
    for step in range(4):
        grads = [f32(randn(*s)) for s in shapes]
        present = [True, True, step != 2]  # score.bias has no gradient at step 2
        for p, g, has in zip(params, grads, present):
            p.grad = torch.tensor(g) if has else None
        opt.step()
        steps.append(dict(grads=[lst(g) if has else None for g, has in zip(grads, present)],
                          params=[lst(p.detach().numpy()) for p in params]))
    return dict(names=names, shapes=[list(s) for s in shapes], init=[lst(p) for p in init], groups=groups,
                membership=membership, lr=base_lr, beta1=betas[0], beta2=betas[1], eps=eps, steps=steps)


def clip_case():
    shapes = [(3, 5), (7,)]
    grads = [f32(randn(*s) * 2.0) for s in shapes]
    out = []
    for max_norm in (1.0, 100.0):
        ps = [torch.nn.Parameter(torch.zeros(*s, dtype=torch.float32)) for s in shapes]
        for p, g in zip(ps, grads):
            p.grad = torch.tensor(g)
        norm = torch.nn.utils.clip_grad_norm_(ps, max_norm)
        out.append(dict(max_norm=max_norm, grads=[lst(g) for g in grads], norm=float(norm),
                        clipped=[lst(p.grad.numpy()) for p in ps]))
    return out


def schedule_case():
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    peak, min_lr, warmup, total = 3e-4, 3e-5, 5, 30
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=peak)
    sched = get_cosine_with_min_lr_schedule_with_warmup(opt, warmup, total, min_lr=min_lr)
    cosine = []
    for _ in range(total + 1):
        cosine.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    linear = []
    for s in range(total + 1):
        if s < warmup:
            linear.append(peak * s / warmup)
        else:
            frac = min(1.0, (s - warmup) / (total - warmup))
            linear.append(min_lr + (peak - min_lr) * (1 - frac))
    return dict(peak_lr=peak, min_lr=min_lr, warmup_steps=warmup, total_steps=total, cosine=cosine, linear=linear)


def kl_loss_cases():
    """KL as a loss, differentiated through log pi as written: the gradients torch autograd
    gives for coef * agg(k) of each estimator (k1 = d, k2 = d^2/2, k3 = e^-d + d - 1 with
    d = log pi - log pi_ref)."""
    cases = []
    mask = torch.tensor(MASK)
    logp0 = torch.tensor(randn(B, T, scale=0.7) - 1.5)
    ref = logp0 + torch.tensor(randn(B, T, scale=0.4))
    for agg in ("token-mean", "seq-mean-token-sum"):
        grads, losses = {}, {}
        for name in ("k1", "k2", "k3"):
            logp = logp0.clone().requires_grad_(True)
            d = logp - ref
            k = {"k1": d, "k2": 0.5 * d ** 2, "k3": torch.exp(-d) + d - 1}[name]
            loss = 0.1 * agg_torch(k, mask, agg)
            loss.backward()
            grads[name] = lst(logp.grad * mask)
            losses[name] = float(loss.detach())
        cases.append(dict(agg=agg, coef=0.1, logprobs=lst(logp0), ref_logprobs=lst(ref), mask=lst(MASK),
                          loss=losses, grad=grads))
    return cases


def gspo_cases():
    """GSPO (Zheng et al. 2025): sequence ratio s_i = exp(mean_t (log pi - log pi_old)) over the
    response, loss -min(s_i A, clip(s_i, 1 - eps_l, 1 + eps_h) A). Case 1: one advantage per
    sequence, the paper's sequence form, mean over sequences. Case 2: per-token advantages,
    GSPO-token (s_it = sg[s_i] pi_t / sg[pi_t]), seq-mean-token-mean."""
    cases = []
    mask = torch.tensor(MASK)
    rows = mask.sum(-1) > 0
    for per_token in (False, True):
        old = torch.tensor(randn(B, T, scale=0.5) - 1.0)
        logp0 = old + torch.tensor(randn(B, T, scale=0.15))
        if per_token:
            adv = torch.tensor(randn(B, T))
        else:
            adv = torch.tensor(randn(B))[:, None].expand(B, T).clone()
        cl, ch = 0.03, 0.05
        logp = logp0.clone().requires_grad_(True)
        n_tok = mask.sum(-1).clamp(min=1)
        log_s = ((logp - old) * mask).sum(-1) / n_tok
        s = torch.exp(log_s)
        if per_token:
            s_t = s.detach()[:, None] * torch.exp(logp - logp.detach())
            tok = -torch.min(s_t * adv, torch.clamp(s_t, 1 - cl, 1 + ch) * adv)
            loss = agg_torch(tok, mask, "seq-mean-token-mean")
        else:
            a = adv[:, 0]
            seq = -torch.min(s * a, torch.clamp(s, 1 - cl, 1 + ch) * a)
            loss = seq[rows].mean()
        loss.backward()
        sv = s.detach()[:, None].expand(B, T)
        clipped = (-adv * torch.clamp(sv, 1 - cl, 1 + ch) > -adv * sv).double()
        cases.append(dict(clip_low=cl, clip_high=ch, agg="seq-mean-token-mean", per_token=per_token,
                          logprobs=lst(logp0), old_logprobs=lst(old), advantages=lst(adv), mask=lst(MASK),
                          loss=float(loss.detach()), grad=lst(logp.grad * mask),
                          clip_frac=float((clipped * mask).sum() / mask.sum()),
                          seq_ratio=lst(s.detach())))
    return cases


def cispo_case():
    """CISPO (MiniMax-M1, 2025): loss_t = -sg(clip(r_t, 1 - eps_l, 1 + eps_h)) A_t log pi_t,
    token-mean over the response (normalised by the total response tokens)."""
    mask = torch.tensor(MASK)
    old = torch.tensor(randn(B, T, scale=0.5) - 1.0)
    logp0 = old + torch.tensor(randn(B, T, scale=0.6))
    adv = torch.tensor(randn(B, T))
    cl, ch = 1.0, 0.3
    logp = logp0.clone().requires_grad_(True)
    r = torch.exp(logp - old)
    w = torch.clamp(r, 1 - cl, 1 + ch).detach()
    loss = agg_torch(-w * adv * logp, mask, "token-mean")
    loss.backward()
    clipped = ((r.detach() > 1 + ch) | (r.detach() < 1 - cl)).double()
    return dict(clip_low=cl, clip_high=ch, agg="token-mean", logprobs=lst(logp0), old_logprobs=lst(old),
                advantages=lst(adv), mask=lst(MASK), loss=float(loss.detach()), grad=lst(logp.grad * mask),
                clip_frac=float((clipped * mask).sum() / mask.sum()))


def rollout_correction_cases():
    """Rollout correction between the engine (behaviour) and the trainer's pi_old, w_t = exp(old - rollout).
    seq_mask (veRL rollout_is_level="geometric", mode "mask"): a sequence is kept (weight 1 on its tokens)
    iff exp(mean_t log w_t) over its response lies in [lower, upper], else weight 0. icepop (Ring-1T):
    M(w) = w if lower <= w <= upper else 0, per token."""
    old = randn(B, T, scale=0.5) - 1.0
    rollout = old + randn(B, T, scale=0.5)
    sel = MASK != 0
    w = np.exp(old - rollout)
    cases = []
    for mode, lower, upper in (("seq_mask", 0.7, 1.3), ("icepop", 0.7, 1.5)):
        if mode == "seq_mask":
            weights = np.zeros((B, T))
            rows, masked_rows = 0, 0
            for b in range(B):
                pos = response_positions(MASK[b])
                if not pos:
                    continue
                rows += 1
                g = math.exp(np.mean([old[b, p] - rollout[b, p] for p in pos]))
                keep = lower <= g <= upper
                masked_rows += 0 if keep else 1
                for p in pos:
                    weights[b, p] = 1.0 if keep else 0.0
            seq_frac = masked_rows / max(rows, 1)
        else:
            weights = np.where(sel & (w >= lower) & (w <= upper), w, 0.0)
            seq_frac = 0.0
        cases.append(dict(mode=mode, lower=lower, upper=upper, trainer_old_logprobs=lst(old),
                          rollout_logprobs=lst(rollout), mask=lst(MASK), weights=lst(weights),
                          weight_mean=float(weights[sel].mean()),
                          masked_frac=float((weights[sel] == 0).mean()), masked_seq_frac=seq_frac))
    return cases


def dynamic_sampling_cases():
    """DAPO dynamic sampling (Yu et al. 2025, eq. 11: keep groups with 0 < |{correct}| < G, i.e.
    whose rewards are not all equal), drawing rounds until `target` informative groups are held;
    short of it after the last round, the batch is filled with the earliest uninformative groups."""
    G = 4
    cases = []
    for target, n_rounds in ((3, 3), (4, 2)):
        rounds = [RNG.integers(0, 2, size=(4, G)).astype(np.float64) * (RNG.random((4, 1)) < 0.6)
                  for _ in range(n_rounds)]
        flags = [[bool(np.any(g != g[0])) for g in r] for r in rounds]
        held, used = 0, 0
        for r in flags:
            used += 1
            held += sum(r)
            if held >= target:
                break
        drawn = flags[:used]
        inf = [(r, g) for r, row in enumerate(drawn) for g, ok in enumerate(row) if ok]
        uninf = [(r, g) for r, row in enumerate(drawn) for g, ok in enumerate(row) if not ok]
        n_inf = min(len(inf), target)
        filled = min(target - n_inf, len(uninf))
        kept = sorted(inf[:n_inf] + uninf[:filled])
        cases.append(dict(group_size=G, target=target, scores=[lst(r.reshape(-1)) for r in rounds],
                          rounds_used=used, kept=kept, dropped=len(uninf) - filled, filled=filled,
                          surplus=len(inf) - n_inf))
    return cases


def distill_cases():
    """On-policy distillation (Thinking Machines 2025, "On-policy distillation"; NeMo RL): per-token
    advantage -(log pi_student - log pi_teacher) on the student's own samples, plus reward_coef times
    the batch-centred task reward."""
    student = randn(B, T, scale=0.5) - 1.5
    teacher = randn(B, T, scale=0.5) - 1.0
    scores = randn(B)
    cases = []
    for coef in (0.0, 0.5):
        adv = -(student - teacher) + coef * (scores - scores.mean())[:, None]
        cases.append(dict(reward_coef=coef, student_logprobs=lst(student), teacher_logprobs=lst(teacher),
                          mask=lst(MASK), scores=lst(scores), advantages=lst(np.where(MASK != 0, adv, 0.0))))
    return cases


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "rlhf", "tests", "fixtures", "reference.json")
    data = dict(
        generator="tools/rlhf_reference.py",
        torch_version=torch.__version__.split("+")[0],
        gae=gae_cases(),
        group=group_cases(),
        reinforce_pp=reinforce_pp_case(),
        whiten=whiten_cases(),
        ppo=ppo_cases(),
        value=value_cases(),
        entropy=entropy_case(),
        kl=kl_case(),
        tis=tis_case(),
        dpo=dpo_cases(),
        bradley_terry=bt_case(),
        sft=sft_case(),
        adaptive_kl=adaptive_kl_case(),
        adamw=adamw_case(),
        clip=clip_case(),
        schedule=schedule_case(),
        kl_loss=kl_loss_cases(),
        gspo=gspo_cases(),
        cispo=cispo_case(),
        rollout_correction=rollout_correction_cases(),
        dynamic_sampling=dynamic_sampling_cases(),
        distill=distill_cases(),
    )
    with open(out, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(out)}")


if __name__ == "__main__":
    main()
