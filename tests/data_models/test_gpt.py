"""The GPT and its Markov-text data: shapes, causality, tied weights, the optimizer's groups; a
data set that is deterministic, sharded disjointly, made without a download, and whose stated
optimum matches computations independent of the module's own."""

import math
import socket
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lightning_cocod.data.markov import MarkovSource, MarkovTextDataModule
from lightning_cocod.models.gpt import GPT, GPTModule

pytestmark = pytest.mark.timeout(120)


def test_logits_have_one_row_per_position_and_vocabulary_entry():
    net = GPT(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16)
    assert net(torch.randint(0, 11, (3, 16))).shape == (3, 16, 11)
    assert net(torch.randint(0, 11, (3, 5))).shape == (3, 5, 11)  # shorter than a block
    with pytest.raises(ValueError, match="longer than block_size=16"):
        net(torch.randint(0, 11, (1, 17)))


def test_a_later_token_never_changes_an_earlier_position_s_logits():
    torch.manual_seed(0)
    net = GPT(vocab_size=7, block_size=12, n_layer=2, n_head=2, n_embd=16).eval()
    x = torch.randint(0, 7, (2, 12))
    changed = x.clone()
    changed[:, 8] = (x[:, 8] + 1) % 7
    with torch.no_grad():
        a, b = net(x), net(changed)
    assert torch.allclose(a[:, :8], b[:, :8], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 8:], b[:, 8:])  # the change is seen from its own position on


def test_the_output_layer_is_the_token_embedding_and_learns_as_one():
    net = GPT(vocab_size=9, block_size=8, n_layer=1, n_head=1, n_embd=8)
    assert net.head.weight is net.tok.weight
    counted = sum(p.numel() for p in net.parameters())  # each tensor once
    by_hand = 9 * 8 + 8 * 8 + (2 * 2 * 8) + (8 * 24 + 24) + (8 * 8 + 8) + (8 * 32 + 32 + 32 * 8 + 8) + 2 * 8
    assert counted == by_hand
    loss = F.cross_entropy(net(torch.randint(0, 9, (2, 8))).transpose(1, 2), torch.randint(0, 9, (2, 8)))
    loss.backward()
    torch.optim.SGD(net.parameters(), lr=1.0).step()
    assert net.head.weight is net.tok.weight


def test_weight_decay_falls_on_matrices_only_and_the_tied_one_once():
    module = GPTModule(vocab_size=9, block_size=8, n_layer=2, n_head=2, n_embd=8, weight_decay=0.1)
    from lightning_cocod.models.classifier import param_groups

    decay, no_decay = param_groups(module.net, 0.1, True)
    assert {id(p) for p in decay["params"]} == {id(p) for p in module.net.parameters() if p.dim() == 2}
    assert {id(p) for p in no_decay["params"]} == {id(p) for p in module.net.parameters() if p.dim() == 1}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(module.net.parameters()))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_embd": 10, "n_head": 4}, "n_embd=10 is invalid; accepted: a multiple of n_head"),
        ({"n_layer": 0}, "n_layer=0 is invalid"),
        ({"dropout": 1.0}, r"dropout=1.0 is invalid; accepted: a number in \[0, 1\)"),
        ({"lr": 0.0}, "lr=0.0 is invalid"),
    ],
)
def test_bad_sizes_are_refused_in_one_line_naming_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GPTModule(vocab_size=9, **{"block_size": 8, **kwargs})


def test_perplexity_is_the_exp_of_the_token_weighted_mean_loss():
    torch.manual_seed(0)
    module = GPTModule(vocab_size=5, block_size=6, n_layer=1, n_head=1, n_embd=8).eval()
    batches = [(torch.randint(0, 5, (n, 6)), torch.randint(0, 5, (n, 6))) for n in (3, 1)]
    logged = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, value)
    with torch.no_grad():
        for batch in batches:
            module._eval_step("val", batch)
        module.on_validation_epoch_end()
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        expected = F.cross_entropy(module.net(x).reshape(-1, 5), y.reshape(-1))
    assert float(logged["val/ppl"]) == pytest.approx(math.exp(expected), rel=1e-5)


# A source small enough to check by brute force: 3 symbols, order 2.
SMALL = {"vocab_size": 3, "order": 2, "concentration": 6.0, "seed": 0}


def test_the_entropy_rate_and_the_block_optimum_match_an_eigenvector_computation():
    source = MarkovSource(**SMALL)
    v, k = 3, 2
    # Dense transition matrix over contexts, its stationary vector from numpy's eigensolver.
    dense = np.zeros((v**k, v**k))
    for c in range(v**k):
        for x in range(v):
            dense[c, (c % v ** (k - 1)) * v + x] += source.transitions[c, x]
    values, vectors = np.linalg.eig(dense.T)
    pi = np.real(vectors[:, np.argmin(np.abs(values - 1))])
    pi /= pi.sum()
    rate = -sum(
        pi[c] * source.transitions[c, x] * math.log(source.transitions[c, x])
        for c in range(v**k)
        for x in range(v)
    )
    unigram = pi.reshape(v, v).sum(0)  # the newest symbol of a stationary context
    h0 = -sum(p * math.log(p) for p in unigram)
    # H(X_2 | X_1): from the pairs (the stationary context itself) as H(X_1, X_2) - H(X_1).
    h1 = -sum(p * math.log(p) for p in pi) - h0
    assert source.entropy_rate == pytest.approx(rate, abs=1e-9)
    assert source.unigram_loss == pytest.approx(h0, abs=1e-9)
    assert source.optimum(10) == pytest.approx((h1 + 9 * rate) / 10, abs=1e-9)


def test_the_source_s_own_loss_on_sampled_blocks_is_the_stated_optimum():
    # Monte Carlo over what the sampler really draws: checks the sampler starts every block in
    # the stationary regime and follows the tables, as the optimum assumes.
    source = MarkovSource(**SMALL)
    blocks = source.sample_blocks(40_000, 9, seed=1)
    v = 3
    nll = []
    for t in range(1, 9):
        if t == 1:  # one symbol of context: the stationary pair distribution's conditional
            pairs = source.stationary.reshape(v, v)
            cond = pairs / pairs.sum(axis=1, keepdims=True)
            p = cond[blocks[:, 0], blocks[:, 1]]
        else:
            p = source.transitions[blocks[:, t - 2] * v + blocks[:, t - 1], blocks[:, t]]
        nll.append(-np.log(p))
    nll = np.stack(nll, axis=1)
    stderr = nll.mean(axis=1).std() / math.sqrt(len(blocks))
    assert nll.mean() == pytest.approx(source.optimum(8), abs=5 * stderr)
    counts = np.bincount(blocks[:, 4], minlength=v) / len(blocks)
    unigram = source.stationary.reshape(v, v).sum(0)
    assert np.abs(counts - unigram).max() < 0.01


def test_the_data_is_the_same_for_the_same_seed_and_different_for_another(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the Markov data must not touch the network")

    monkeypatch.setattr(socket, "socket", no_network)
    kwargs = {"num_train_blocks": 64, "num_val_blocks": 16, "num_test_blocks": 16, "block_size": 16}
    a, b = MarkovTextDataModule(**kwargs), MarkovTextDataModule(**kwargs)
    c = MarkovTextDataModule(source_seed=7, **kwargs)
    for dm in (a, b, c):
        dm.setup()
    for name in ("train_tensors", "eval_tensors", "test_tensors"):
        assert all(torch.equal(s, t) for s, t in zip(getattr(a, name), getattr(b, name)))
        assert not torch.equal(getattr(a, name)[0], getattr(c, name)[0])
    x, y = a.train_tensors
    assert x.shape == y.shape == (64, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one character
    assert not torch.equal(a.train_tensors[0][:16], a.eval_tensors[0])  # independent streams
    assert a.unigram_loss > a.optimum > 0


def test_ranks_train_and_evaluate_on_disjoint_shards():
    dm = MarkovTextDataModule(
        num_train_blocks=96, num_val_blocks=21, num_test_blocks=9, block_size=8, batch_size=8
    )
    dm.setup()
    world = 3

    def rows(loader):
        return [tuple(row.tolist()) for x, _ in loader for row in x]

    def everything(tensors):
        return sorted(tuple(row.tolist()) for row in tensors[0])

    train, val, test = [], [], []
    for rank in range(world):
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=world)  # what the loaders read
        train.append(rows(dm.train_dataloader()))
        val.append(rows(dm.val_dataloader()))
        test.append(rows(dm.test_dataloader()))
    for shards, tensors in ((train, dm.train_tensors), (val, dm.eval_tensors), (test, dm.test_tensors)):
        assert len({len(s) for s in shards}) == 1  # as many batches of blocks on every rank
        assert sorted(row for s in shards for row in s) == everything(tensors)  # each block once


def test_bad_data_arguments_are_refused_in_one_line_naming_the_key():
    with pytest.raises(ValueError, match=r"block_size=2 is invalid; accepted: an int >= order \(3\)"):
        MarkovTextDataModule(block_size=2)
    with pytest.raises(ValueError, match="concentration=0 is invalid; accepted: a positive number"):
        MarkovSource(concentration=0)
    with pytest.raises(ValueError, match="vocab_size=1 is invalid"):
        MarkovSource(vocab_size=1)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("order", ["3", None, 2.5, True])
def test_an_order_that_is_no_int_is_refused_naming_order_before_block_size_is_compared_with_it(order):
    with pytest.raises(
        ValueError, match=rf"MarkovTextDataModule: order={order!r} is invalid; accepted: an int >= 1"
    ):
        MarkovTextDataModule(order=order)


@pytest.mark.timeout(10)
def test_a_huge_order_is_refused_before_its_table_size_is_computed():
    """order=10**8 made the size check compute 27**(10**8 + 1) as a Python integer: minutes."""
    with pytest.raises(ValueError, match=r"order=100000000 is invalid; accepted: an order with vocab_size\^"):
        MarkovTextDataModule(order=10**8, block_size=10**8)
    with pytest.raises(
        ValueError, match=r"order=22 is invalid"
    ):  # 2^23 > 8e6: the first order past the bound
        MarkovSource(vocab_size=2, order=22)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("concentration", [math.inf, math.nan, -math.inf])
def test_a_concentration_that_is_not_finite_is_refused_naming_it(concentration):
    with pytest.raises(
        ValueError, match=r"concentration=\S+ is invalid; accepted: a positive number \(finite\)"
    ):
        MarkovTextDataModule(concentration=concentration)


@pytest.mark.timeout(10)
def test_a_chain_that_mixes_too_slowly_is_refused_naming_concentration_at_once():
    """concentration=1e-3 drew, with the default source, a chain that mixes over millions of steps:
    the power iteration ran 100,000 of them (a minute) and failed naming nothing."""
    with pytest.raises(
        ValueError, match=r"concentration=0.001 is invalid; accepted: one whose chain mixes within"
    ):
        MarkovTextDataModule(concentration=1e-3)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("source", [(10, 4, 0.5, 1234), (27, 3, 2.0, 1234)])
def test_a_nearly_periodic_chain_gets_its_stationary_distribution_from_the_lazy_chain(source):
    """These chains never settle under the plain iteration (one swings between two distributions
    for ever; they ran 100,000 steps and failed): the lazy chain (P + I) / 2 has the same stationary
    distribution and settles in a few hundred steps."""
    markov = MarkovSource(*source)
    pi, (v, k) = markov.stationary, (markov.vocab_size, markov.order)
    moved = (pi[:, None] * markov.transitions).reshape(v, v ** (k - 1) * v).sum(axis=0)
    assert pi.min() >= 0 and pi.sum() == pytest.approx(1.0)
    assert np.abs(moved - pi).sum() < 1e-12  # stationary under the chain itself, not only the lazy one


def test_the_default_sources_are_bit_for_bit_what_they_were():
    """The data of the configs in conf/ (the default source; the stationary distribution the
    plain iteration found before the lazy chain and the budget were added), by digest."""
    import hashlib

    dm = MarkovTextDataModule(num_train_blocks=512, num_val_blocks=64, num_test_blocks=64)
    dm.setup()
    digest = hashlib.sha256(dm.source.stationary.tobytes())
    for tensors in (dm.train_tensors, dm.eval_tensors, dm.test_tensors):
        for t in tensors:
            digest.update(t.numpy().tobytes())
    assert digest.hexdigest()[:16] == "3dc147ccf7f20541"  # computed with the code before the budget
