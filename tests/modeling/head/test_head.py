"""The head math against independent reference computations, and the paper's three properties."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from testing_utils import reference_scores

from hf_tiednorm import HEAD_MODES, LOGIT_SCALES, TiedNormEmbedding, TiedNormHead
from hf_tiednorm.modeling.head.settings import HeadSettings


def make_head(head_mode: str, vocab: int = 50, dim: int = 16, seed: int = 0, **kwargs) -> TiedNormHead:
    torch.manual_seed(seed)
    head = TiedNormHead(dim, vocab, settings=HeadSettings(head_mode=head_mode, **kwargs))
    torch.nn.init.normal_(head.weight, std=0.5)
    return head


# 3 × 5 = 15 tokens <= d = 16 scale the logits; 4 × 10 = 40 tokens > d (every training batch, wide beam search)
# fold the per-token scale into the rows of W instead: both branches against the same independent reference.
@pytest.mark.parametrize("shape", [(3, 5), (4, 10)], ids=["logit-scaled", "row-scaled"])
@pytest.mark.parametrize("logit_scale", LOGIT_SCALES)
@pytest.mark.parametrize("head_mode", HEAD_MODES)
def test_scores_match_reference(head_mode, logit_scale, shape):
    init = None if logit_scale == "none" else 3.0
    head = make_head(head_mode, logit_scale_kind=logit_scale, logit_scale_init=init)
    if logit_scale == "vector":  # distinct per-token scales, so a wrong broadcast would show
        head.logit_scale.data = torch.linspace(0.5, 2.0, head.weight.shape[0])
    hidden = torch.randn(*shape, 16)
    expected = reference_scores(head.weight.detach(), hidden, head_mode)
    if logit_scale == "fixed":
        expected = expected * 3.0
    elif logit_scale in ("scalar", "vector"):
        expected = expected * head.logit_scale.detach().double()
    with torch.no_grad():
        actual = head(hidden)
    assert actual.shape == (*shape, 50)
    torch.testing.assert_close(actual.double(), expected, rtol=1e-5, atol=1e-5)


def test_a_learned_logit_scale_starts_at_one_and_a_fixed_one_at_sqrt_d():
    # A learned g starts where the head equals the scale-free one (√d made the step-0 logits √d× too sharp, issue 25);
    # "fixed" keeps √d, which saved fixed-scale models depend on.
    assert TiedNormHead(64, 10, settings=HeadSettings(logit_scale_kind="scalar")).logit_scale.item() == 1.0
    vector = TiedNormHead(64, 10, settings=HeadSettings(logit_scale_kind="vector"))
    assert torch.equal(vector.logit_scale.detach(), torch.ones(10))
    fixed = TiedNormHead(64, 10, settings=HeadSettings(logit_scale_kind="fixed"))
    assert fixed.logit_scale is None and fixed.term_starts["logit_scale"] == pytest.approx(8.0)
    assert torch.equal(fixed.column_terms()[0], torch.full((10,), fixed.term_starts["logit_scale"]))  # folded in
    started = TiedNormHead(64, 10, settings=HeadSettings(logit_scale_kind="vector", logit_scale_init=3.0))
    assert started.logit_scale[0].item() == 3.0


@pytest.mark.parametrize("tokens", [4, 40], ids=["logit-scaled", "row-scaled"])
@pytest.mark.parametrize("head_mode", HEAD_MODES)
def test_gradients_flow_through_the_normalization(head_mode, tokens):
    head = make_head(head_mode, logit_scale_kind="scalar", logit_scale_init=2.0)
    hidden = torch.randn(tokens, 16, requires_grad=True)
    targets = torch.randint(0, 50, (tokens,))
    F.cross_entropy(head(hidden), targets).backward()

    weight = head.weight.detach().double().requires_grad_()
    hidden_ref = hidden.detach().double().requires_grad_()
    scale = torch.tensor(2.0, dtype=torch.double, requires_grad=True)
    F.cross_entropy(reference_scores(weight, hidden_ref, head_mode) * scale, targets).backward()

    torch.testing.assert_close(head.weight.grad.double(), weight.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(hidden.grad.double(), hidden_ref.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(head.logit_scale.grad.double(), scale.grad, rtol=1e-4, atol=1e-6)


# --- The paper's properties -------------------------------------------------------------------------------


@pytest.mark.parametrize("head_mode", ["l2", "cosine", "distance"])
def test_identity_property(head_mode):
    """h = w_k ⇒ argmax_i s_i = k (l2, cosine: no two rows parallel; distance: no two rows equal)."""
    head = make_head(head_mode, vocab=200, dim=16)
    with torch.no_grad():
        head.weight.mul_(torch.rand(200, 1) * 3 + 0.05)  # very different row norms
        scores = head(head.weight.detach().clone())  # row k is h = w_k
    assert torch.equal(scores.argmax(-1), torch.arange(200))


def test_identity_property_square_with_equal_norm_rows():
    head = make_head("square", vocab=200, dim=16)
    with torch.no_grad():
        head.weight.copy_(F.normalize(head.weight, dim=-1) * 1.7)
        scores = head(head.weight.detach().clone())
    assert torch.equal(scores.argmax(-1), torch.arange(200))


def test_square_and_baseline_break_identity_when_norms_differ():
    """Non-collinearity is not enough for square: s_i = ‖w_k‖cosθ/‖w_i‖ exceeds s_k = 1 for a short w_i
    pointing near w_k. Baseline fails for a long w_i. (cosine, l2 and distance pass the same case above.)"""
    weight = torch.tensor([[1.0, 0.0], [0.1, 0.02], [5.0, 3.0]])
    for head_mode, winner in (("square", 1), ("baseline", 2)):
        head = TiedNormHead(2, 3, settings=HeadSettings(head_mode=head_mode))
        head.weight.data = weight.clone()
        with torch.no_grad():
            assert head(weight[0]).argmax().item() == winner
    for head_mode in ("l2", "cosine", "distance"):
        head = TiedNormHead(2, 3, settings=HeadSettings(head_mode=head_mode))
        head.weight.data = weight.clone()
        with torch.no_grad():
            assert head(weight[0]).argmax().item() == 0


def test_normality_property_l2():
    """l2: if h is a convex combination of unit rows, every score is at most 1 (and h = ŵ_k scores exactly 1)."""
    head = make_head("l2", vocab=100, dim=16)
    unit_rows = F.normalize(head.weight.detach(), dim=-1)
    mixing = torch.softmax(torch.randn(500, 100) * 3, dim=-1)  # random convex combinations
    with torch.no_grad():
        scores = head(mixing @ unit_rows)
        assert scores.max().item() <= 1 + 1e-5
        assert torch.allclose(head(unit_rows).diagonal(), torch.ones(100), atol=1e-5)


def win_frequency_norm_correlation(head_mode: str, vocab: int = 40, dim: int = 8, samples: int = 40_000) -> float:
    """Pearson correlation between ‖w_i‖ and how often token i wins for h uniform on the unit sphere.

    Rows have directions uniform on the sphere and norms spread over [0.2, 3]; an unbiased score makes the
    winner depend on direction only, so the correlation is ~0; a norm-biased one favours long rows.
    """
    generator = torch.Generator().manual_seed(1)
    directions = F.normalize(torch.randn(vocab, dim, generator=generator), dim=-1)
    norms = torch.linspace(0.2, 3.0, vocab)[torch.randperm(vocab, generator=generator)]
    head = TiedNormHead(dim, vocab, settings=HeadSettings(head_mode=head_mode))
    head.weight.data = directions * norms[:, None]
    hidden = F.normalize(torch.randn(samples, dim, generator=generator), dim=-1)
    with torch.no_grad():
        wins = torch.bincount(head(hidden).argmax(-1), minlength=vocab).double()
    return torch.corrcoef(torch.stack([norms.double(), wins]))[0, 1].item()


@pytest.mark.parametrize("head_mode", ["l2", "cosine"])
def test_unbiasedness_property(head_mode):
    assert abs(win_frequency_norm_correlation(head_mode)) < 0.25


def test_unbiasedness_check_detects_the_norm_bias_of_baseline():
    """The same statistic on the tied baseline: long rows win far more often (so the test above can fail)."""
    assert win_frequency_norm_correlation("baseline") > 0.6


# --- Caching, precision, zero rows -----------------------------------------------------------------------------


def test_column_terms_are_reused_only_inside_a_frozen_scope():
    head = make_head("cosine", logit_scale_kind="vector")
    with torch.no_grad():
        assert head.column_terms()[0] is not head.column_terms()[0]  # outside a scope: always recomputed
        with head.frozen_column_terms():
            first = head.column_terms()
            with head.frozen_column_terms():  # nested scopes share the outer one's terms
                assert head.column_terms()[0] is first[0]
            assert head.column_terms()[0] is first[0]
        assert head.column_terms()[0] is not first[0]  # leaving the scope dropped them
    with head.frozen_column_terms():  # with gradients, never reused
        assert head.column_terms()[0] is not head.column_terms()[0]


@pytest.mark.parametrize("write", ["data_copy", "data_replace", "optimizer_step"])
@pytest.mark.parametrize("head_mode", ["l2", "square", "distance", "cosine"])
def test_logits_follow_every_kind_of_weight_write(head_mode, write):
    """Writes through ``.data`` bump no version counter and may keep the storage (FSDP refills, PEFT merges do the
    same): the old pointer + version cache served the previous norms after them (cosine off by 3e7)."""
    head = make_head(head_mode, logit_scale_kind="vector")
    hidden = torch.randn(3, 16)
    with torch.no_grad():
        head(hidden)
        new_weight = torch.randn_like(head.weight) * 1e-2
        if write == "data_copy":
            head.weight.data.copy_(new_weight)  # same storage, same version
        elif write == "data_replace":
            head.weight.data = new_weight  # new storage of the same shape
    if write == "optimizer_step":
        optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
        F.cross_entropy(head(hidden), torch.tensor([1, 2, 3])).backward()
        optimizer.step()
    with torch.no_grad():
        expected = reference_scores(head.weight, hidden, head_mode) * head.logit_scale.double()
        torch.testing.assert_close(head(hidden).double(), expected, rtol=1e-5, atol=1e-5)


def test_cache_refreshed_after_weight_data_is_replaced_by_a_resize():
    head = make_head("square", vocab=10)
    with torch.no_grad():
        head(torch.randn(1, 16))
        head.weight.data = torch.randn(12, 16)  # what resize_token_embeddings does to a tied weight
        head.match_vocab_size()
        hidden = torch.randn(1, 16)
        torch.testing.assert_close(
            head(hidden).double(), reference_scores(head.weight, hidden, "square"), rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("head_mode", HEAD_MODES)
def test_dead_rows_score_zero_and_get_no_gradient(head_mode):
    """A row with norm <= norm_eps counts as zero: score 0 and no gradient through its (undefined) direction.
    Before, 1/max(‖w‖, eps) gave such a row a gradient of h/eps, ~1e6 times everyone else's."""
    head = make_head(head_mode, logit_scale_kind="scalar")
    with torch.no_grad():
        head.weight[3] = 0  # HF zeroes the padding row
        head.weight[4] = 1e-8  # below norm_eps
    hidden = torch.randn(40, 16)  # tokens > d: the row-scaled (training-batch) branch
    logits = head(hidden)
    torch.testing.assert_close(
        logits.double(),
        reference_scores(head.weight, hidden, head_mode) * head.logit_scale.double(),
        rtol=1e-5,
        atol=1e-5,
    )
    logits.sum().backward()
    row_grads = head.weight.grad.norm(dim=-1)
    if head_mode in ("l2", "square", "cosine"):
        assert torch.equal(logits[:, 3:5], torch.zeros(40, 2))
        assert torch.equal(row_grads[3:5], torch.zeros(2))
    assert row_grads.max() < 50 * row_grads.median()


def test_l2_lookup_of_a_dead_row_is_zero_with_zero_gradient():
    embedding = TiedNormEmbedding(20, 8, normalize=True)  # no padding_idx: nothing else guards the zero row
    with torch.no_grad():
        embedding.weight[2] = 0
    vectors = embedding(torch.tensor([2, 3]))
    assert torch.equal(vectors[0], torch.zeros(8))
    vectors.sum().backward()
    assert torch.equal(embedding.weight.grad[2], torch.zeros(8))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_mode", HEAD_MODES)
def test_low_precision_and_zero_rows_give_finite_logits(head_mode, dtype):
    head = make_head(head_mode, logit_scale_kind="scalar").to(dtype)
    with torch.no_grad():
        head.weight[3] = 0  # e.g. a padding row
        head.weight[4] = 1e-4  # tiny row: its norm underflows in fp16 if computed there
        logits = head(torch.randn(4, 16, dtype=dtype))
    assert torch.isfinite(logits).all()


def test_l2_embedding_looks_up_unit_rows_and_keeps_padding_zero():
    embedding = TiedNormEmbedding(20, 8, padding_idx=0, normalize=True)
    torch.nn.init.normal_(embedding.weight, std=3.0)
    with torch.no_grad():
        embedding.weight[0] = 0
    vectors = embedding(torch.tensor([[0, 1, 5, 19]]))
    assert vectors[0, 0].abs().sum() == 0
    torch.testing.assert_close(vectors[0, 1:].norm(dim=-1), torch.ones(3))
    plain = TiedNormEmbedding(20, 8, normalize=False)
    assert torch.equal(plain(torch.tensor([3])), plain.weight[3:4])


def test_l2_embedding_equals_normalizing_all_rows_in_value_and_gradient():
    embedding = TiedNormEmbedding(20, 8, normalize=True)
    reference_weight = embedding.weight.detach().clone().requires_grad_()
    ids = torch.tensor([[1, 5, 5, 19], [0, 2, 5, 7]])
    vectors = embedding(ids)
    reference = F.normalize(reference_weight, dim=-1)[ids]
    torch.testing.assert_close(vectors, reference)
    upstream = torch.randn_like(vectors)
    (vectors * upstream).sum().backward()
    (reference * upstream).sum().backward()
    torch.testing.assert_close(embedding.weight.grad, reference_weight.grad)


def test_head_rejects_unknown_mode_and_scale():
    with pytest.raises(ValueError, match="head_mode must be one of"):
        TiedNormHead(4, 4, settings=HeadSettings(head_mode="unit"))
    with pytest.raises(ValueError, match="logit_scale_kind must be one of"):
        TiedNormHead(4, 4, settings=HeadSettings(logit_scale_kind="learned"))
