"""A second torch set, written after the code and measured once without tuning."""

import torch
import torch.nn.functional as F

CASES = {}


def case(name, source, *args):
    def deco(fun):
        CASES[name] = (fun, args, source)
        return fun

    return deco


@case("where_xlogx", "jax-ml/jax#347", [0.0, 2.0])
def where_xlogx(x):
    lx = torch.log(x)  # O:where_xlogx
    return torch.sum(torch.where(x > 0, x * lx, torch.zeros_like(x)))  # Z:where_xlogx


@case("kl_masked_targets", "snipsco/ntm-lasagne#5", [0.5, 0.5, 0.0])
def kl_masked_targets(q):
    p = torch.tensor([0.6, 0.4, 0.0])
    logq = torch.log(q)  # O:kl_masked_targets
    return torch.sum(p * (torch.log(torch.where(p > 0, p, torch.ones_like(p))) - logq))


@case("last_token_loss", "pytorch/pytorch#41508", [[0.1, 0.9], [0.0, 1.0]])
def last_token_loss(p):
    lp = torch.log(p)  # O:last_token_loss
    return -torch.sum(lp[-1:, 1])  # Z:last_token_loss


@case("softplus_inverse", "jax-ml/jax#1538", [0.0, 1.0])
def softplus_inverse(y):
    inv = torch.log(torch.expm1(y))  # O:softplus_inverse
    return torch.sum(torch.where(y > 0, inv, torch.zeros_like(y)))  # Z:softplus_inverse


@case("weighted_by_gaussian", "snipsco/ntm-lasagne#5", [30.0, 0.5])
def weighted_by_gaussian(x):
    # (label fixed after the one measurement: the underflowed weight (x = 30) and the
    # infinite slope (x = 0.5) are different elements, so no zero meets the inf: no Z line)
    w = torch.exp(-0.5 * x**2)
    return torch.sum(w * torch.sqrt(torch.abs(x) - 0.5))  # O:weighted_by_gaussian


@case("pairwise_distance_mask", "jax-ml/jax#654", [[0.0, 0.0], [1.0, 1.0]])
def pairwise_distance_mask(x):
    d = torch.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))  # O:pairwise_distance_mask
    return torch.sum(d * (1.0 - torch.eye(2)))  # Z:pairwise_distance_mask


@case("index_select_rows", "pytorch/pytorch#41508", [[1.0, 0.0], [4.0, 9.0]])
def index_select_rows(x):
    r = torch.sqrt(x)  # O:index_select_rows
    return torch.sum(torch.index_select(r, 0, torch.tensor([1])))  # Z:index_select_rows


@case("clean_cosine", "pytorch/pytorch#2421", [1.0, 0.0], [0.0, 1.0])
def clean_cosine(a, b):
    return F.cosine_similarity(a[None], b[None]).sum()


@case("clean_layer_norm", "control", [[1.0, 2.0, 3.0]])
def clean_layer_norm(x):
    return F.layer_norm(x, (3,)).sum()
