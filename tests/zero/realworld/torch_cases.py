"""Real-world PyTorch NaN-gradient programs, re-expressed small from public reports.

The same conventions as jax_cases.py: ``# O:<name>`` marks the true origin, ``# Z:<name>`` the
operation that makes the zero factor exact; ``clean_*`` are controls. Arguments are lists
turned into tensors that require grad.
"""

import numpy as np
import torch
import torch.nn.functional as F

CASES = {}


def case(name, source, *args):
    def deco(fun):
        CASES[name] = (fun, args, source)
        return fun

    return deco


@case("where_after_sqrt", "jax-ml/jax#347", [[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]])
def where_after_sqrt(x):
    x = torch.sqrt(torch.sum(x**2, dim=1))  # O:where_after_sqrt
    ones = torch.ones_like(x)
    x = torch.where(x > 0.5, x, ones)  # Z:where_after_sqrt
    return torch.sum(x)


@case("gaussian_distance", "open-mmlab/mmrotate#205", [1.0, 2.0], [1.0, 2.0])
def gaussian_distance(mu1, mu2):
    d2 = torch.sum((mu1 - mu2) ** 2)  # Z:gaussian_distance
    return torch.sqrt(d2)  # O:gaussian_distance


@case("one_hot_cross_entropy", "snipsco/ntm-lasagne#5", [[0.0, 0.3, 0.7], [0.5, 0.5, 0.0]])
def one_hot_cross_entropy(p):
    labels = F.one_hot(torch.tensor([2, 0]), 3).float()  # Z:one_hot_cross_entropy
    logp = torch.log(p)  # O:one_hot_cross_entropy
    return -torch.sum(labels * logp)


PAD = torch.tensor([1.0, 1.0, 0.0])


@case("padding_mask_loss", "seung-lab/znn-release#54", [0.5, 0.25, 0.0])
def padding_mask_loss(probs):
    per_tok = -torch.log(probs)  # O:padding_mask_loss
    return torch.sum(per_tok * PAD) / torch.sum(PAD)  # Z:padding_mask_loss


@case("causal_shift", "pytorch/pytorch#41508", [[0.5, 0.5, 0.0], [0.2, 0.8, 0.0]])
def causal_shift(p):
    logits = torch.log(p)  # O:causal_shift
    return -torch.sum(logits[:, :-1])  # Z:causal_shift


@case("underflowed_weight", "snipsco/ntm-lasagne#5", [20.0, 0.0], [0.0, 1.0])
def underflowed_weight(x, y):
    w = torch.exp(-(x**2))  # Z:underflowed_weight
    ly = torch.log(y)  # O:underflowed_weight
    return torch.sum(w * ly)


@case("nan_to_num_log", "jax-ml/jax#347", [0.0, 2.0])
def nan_to_num_log(x):
    y = torch.log(x)  # O:nan_to_num_log
    return torch.sum(torch.nan_to_num(y))  # Z:nan_to_num_log


@case("rmse_perfect_fit", "pytorch/pytorch#2421", [1.0, 2.0], [1.0, 2.0])
def rmse_perfect_fit(pred, target):
    err = (pred - target) ** 2  # Z:rmse_perfect_fit
    return torch.sqrt(torch.mean(err))  # O:rmse_perfect_fit


@case("embedding_gather", "jax-ml/jax#347", [[0.5, 0.5], [0.0, 1.0]])
def embedding_gather(table):
    emb = torch.log(table)  # O:embedding_gather
    ids = torch.tensor([0, 0])
    return torch.sum(emb[ids])  # Z:embedding_gather


@case("guarded_inverse", "jax-ml/jax#654", [0.0, 2.0])
def guarded_inverse(d):
    inv = 1.0 / d  # O:guarded_inverse
    return torch.sum(torch.where(d > 0, inv, 0.0))  # Z:guarded_inverse


PAIR_MASK = 1.0 - torch.eye(2)


@case("pairwise_mask", "jax-ml/jax#654", [[0.0, 1.0], [1.0, 0.0]])
def pairwise_mask(x):
    diff = x[:, None, :] - x[None, :, :]
    d = torch.sqrt(torch.sum(diff**2, dim=-1))  # O:pairwise_mask
    return torch.sum(d * PAIR_MASK)  # Z:pairwise_mask


@case("log1p_padding", "HIPS/autograd#802", [1.0, 0.5])
def log1p_padding(p):
    lq = torch.log1p(-p)  # O:log1p_padding
    valid = torch.tensor([False, True])
    return torch.sum(torch.where(valid, lq, 0.0))  # Z:log1p_padding


@case("where_log_mask", "Ciela-Institute/caustics#83", [0.0, 0.5])
def where_log_mask(p):
    lp = torch.log(p)  # O:where_log_mask
    return torch.sum(torch.where(p > 0, lp, torch.zeros_like(p)))  # Z:where_log_mask


ADD_MASK = torch.full((2, 2), float("-inf")).triu(1)
ADD_MASK[1] = float("-inf")  # a fully masked row


@case("additive_mask_row_sliced", "pytorch/pytorch#41508", [[1.0, 1.0], [1.0, 1.0]])
def additive_mask_row_sliced(q):
    scores = q @ q.T + ADD_MASK
    attn = torch.softmax(scores, dim=-1)  # O:additive_mask_row_sliced
    return torch.sum(attn[:1])  # Z:additive_mask_row_sliced


NP_MASK = torch.tensor(np.array([[0.0, -np.inf], [-np.inf, -np.inf]], dtype=np.float32))


@case("numpy_inf_mask_row_sliced", "erickrf/multiffn-nli#10", [[1.0, 1.0], [1.0, 1.0]])
def numpy_inf_mask_row_sliced(q):
    scores = q @ q.T + NP_MASK
    attn = torch.softmax(scores, dim=-1)  # O:numpy_inf_mask_row_sliced
    return torch.sum(attn[:1])  # Z:numpy_inf_mask_row_sliced


# ---- added in session 13 (marks set from the programs before the first measurement) -----------

LOGIT_MASK = torch.tensor([0.0, float("-inf"), 0.0])


@case("entropy_masked_logits", "huggingface/trl#7221", [1.0, 2.0, 3.0])
def entropy_masked_logits(z):
    logp = F.log_softmax(z + LOGIT_MASK, dim=-1)
    p = torch.exp(logp)  # Z:entropy_masked_logits
    return -torch.sum(p * logp)  # O:entropy_masked_logits


@case("entropy_nan_to_num", "huggingface/trl#7252", [1.0, 2.0, 3.0])
def entropy_nan_to_num(z):
    logp = F.log_softmax(z + LOGIT_MASK, dim=-1)
    terms = torch.exp(logp) * logp  # O:entropy_nan_to_num
    return -torch.sum(terms.nan_to_num(nan=0.0))  # Z:entropy_nan_to_num


@case("masked_fill_inf_loss", "pytorch/pytorch#23156", [0.5, 0.0, 0.25])
def masked_fill_inf_loss(p):
    per = -torch.log(p)  # O:masked_fill_inf_loss
    per = per.masked_fill(torch.isinf(per), 0.0)  # Z:masked_fill_inf_loss
    return torch.sum(per)


DIVISOR = torch.tensor([0.0, 1.0])


@case("divide_then_boolean_index", "pytorch/pytorch#4132", [1.0, 1.0])
def divide_then_boolean_index(x):
    y = x / DIVISOR  # O:divide_then_boolean_index
    return torch.sum(y[DIVISOR != 0])  # Z:divide_then_boolean_index


BASE = torch.tensor([0.0, 2.0])


@case("clean_pow_zero_base_exponent", "pytorch/pytorch#27134", [1.0, 1.0])
def clean_pow_zero_base_exponent(b):
    # (a control since the one measurement: torch's pow backward now returns 0 for d/db 0 ** b,
    # the fix that issue asked for; JAX's pow_zero_base is the NaN case)
    return torch.sum(BASE**b)


@case("std_by_hand_constant", "pytorch/pytorch#2421", [[2.0, 1.0], [2.0, 3.0]])
def std_by_hand_constant(x):
    d = x - x.mean(dim=0)  # Z:std_by_hand_constant
    s = torch.sqrt((d**2).mean(dim=0))  # O:std_by_hand_constant
    return torch.sum(d / (s + 1e-5))


@case("acos_of_cosine", "pytorch/pytorch#61810", [1.0, 0.0], [1.0, 0.0])
def acos_of_cosine(a, b):
    c = torch.sum(a * b) / (a.norm() * b.norm())  # Z:acos_of_cosine
    return torch.acos(c)  # O:acos_of_cosine


@case("softmax_underflow_entropy", "deeplearning4j/deeplearning4j#785", [0.0, -200.0])
def softmax_underflow_entropy(z):
    p = torch.softmax(z, dim=-1)  # Z:softmax_underflow_entropy
    return -torch.sum(p * torch.log(p))  # O:softmax_underflow_entropy


# ---- clean controls ----------------------------------------------------------------------------


@case("clean_double_where", "jax-ml/jax#347", [[1.0, 2.0], [0.0, 0.0]])
def clean_double_where(x):
    s = torch.sum(x**2, dim=1)
    ok = s > 0.5
    return torch.sum(torch.where(ok, torch.sqrt(torch.where(ok, s, torch.ones_like(s))), 1.0))


@case("clean_cross_entropy", "snipsco/ntm-lasagne#5", [[1.0, -50.0, 3.0]])
def clean_cross_entropy(z):
    return F.cross_entropy(z, torch.tensor([2]))


@case("clean_masked_attention", "pytorch/pytorch#41508", [[1.0, 1.0], [1.0, 1.0]])
def clean_masked_attention(q):
    mask = torch.tensor([[False, True], [False, False]])
    scores = (q @ q.T).masked_fill(mask, float("-inf"))
    return torch.sum(torch.softmax(scores, dim=-1))


@case("clean_pad_mask", "seung-lab/znn-release#54", [0.5, 0.25, 0.1])
def clean_pad_mask(probs):
    return torch.sum(-torch.log(probs) * PAD)


@case("clean_zero_norm", "pytorch/pytorch#2421", [0.0])
def clean_zero_norm(x):
    return x.norm()  # torch's norm backward masks the 0 / 0 at zero


@case("clean_masked_fill_row_sliced", "pytorch/pytorch#41508", [[1.0, 1.0], [1.0, 1.0]])
def clean_masked_fill_row_sliced(q):
    mask = torch.tensor([[False, False], [True, True]])
    scores = (q @ q.T).masked_fill(mask, float("-inf"))
    return torch.sum(torch.softmax(scores, dim=-1)[:1])  # masked_fill's backward zeroes the row


@case("clean_relu_mlp", "control", [[1.0, -1.0], [0.5, 2.0]], [0.3, -0.2])
def clean_relu_mlp(w, x):
    return torch.sum(torch.relu(w @ x) ** 2)


@case("clean_cdist_identical", "pytorch/pytorch#37154", [[0.0, 1.0], [0.0, 1.0]])
def clean_cdist_identical(x):
    return torch.sum(torch.cdist(x, x))  # cdist's backward returns 0 at a zero distance


@case("clean_log_softmax_entropy", "huggingface/trl#7221", [0.0, -200.0])
def clean_log_softmax_entropy(z):
    logp = F.log_softmax(z, dim=-1)  # exp(-200) underflows to 0, but 0 * -200 is 0
    return -torch.sum(torch.exp(logp) * logp)


@case("clean_sqrt_relu", "control", [-1.0, 4.0])
def clean_sqrt_relu(x):
    return torch.sum(torch.sqrt(torch.relu(x)))  # relu's backward selects: 0, not inf * 0
