"""text_classification on stock Hugging Face classifiers, tuple and dict batches, against each
sequence run alone and unpadded in float64."""

import pytest
import torch

from tests.fixtures.hf_models import bert_classifier, gpt2_classifier, padded_tokens
from trak_dist.errors import ConfigError
from trak_dist.gradients import GradientComputer, IterativeGradientComputer
from trak_dist.tasks import TextClassification


def params_of(model):
    return {k: v.detach() for k, v in model.named_parameters()}, {
        k: v.detach() for k, v in model.named_buffers()
    }


def reference(model, ids, mask, labels, types=None):
    """Margin and 1 − p per sequence from a forward of that sequence alone, via log-softmax."""
    fs, qs = [], []
    for i in range(len(ids)):
        keep = mask[i].bool()
        kwargs = {"input_ids": ids[i, keep][None]}
        if types is not None:
            kwargs["token_type_ids"] = types[i, keep][None]
        with torch.no_grad():
            logp = torch.log_softmax(model(**kwargs).logits[0], -1)
        p = logp[labels[i]].exp()
        fs.append(logp[labels[i]] - torch.log1p(-p))
        qs.append(1 - p)
    return torch.stack(fs), torch.stack(qs)


def bert_data(n=5):
    ids, mask = padded_tokens(n, seed=3)
    types = ((torch.arange(ids.shape[1]) >= 4) & mask.bool()).long()
    labels = torch.arange(n) % 3
    return ids, types, mask, labels


@pytest.mark.parametrize("form", ["tuple", "dict_labels", "dict_label"])
def test_bert_margin_and_q(form):
    model = bert_classifier(seed=4).double()
    ids, types, mask, labels = bert_data()
    if form == "tuple":
        batch = (ids, types, mask, labels)
    else:
        key = "labels" if form == "dict_labels" else "label"
        # an extra column (as datasets often carry) is ignored
        batch = {
            "input_ids": ids,
            "token_type_ids": types,
            "attention_mask": mask,
            key: labels,
            "idx": torch.arange(5),
        }
    f_ref, q_ref = reference(model, ids, mask, labels, types)
    task = TextClassification()
    weights, buffers = params_of(model)
    torch.testing.assert_close(task.get_outputs(model, batch), f_ref, rtol=1e-9, atol=1e-9)
    q = task.get_out_to_loss_grad(model, weights, buffers, batch)
    torch.testing.assert_close(q, q_ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("form", ["tuple3", "dict"])
def test_models_without_token_types(form):
    """GPT-2 classifies from its last real token; no token_type_ids are passed (GPT-2 would
    embed zeros as token 0, so zeros are not the same as none)."""
    model = gpt2_classifier(seed=5).double()
    ids, mask = padded_tokens(4, seed=6)
    labels = torch.tensor([0, 2, 1, 2])
    batch = (
        (ids, mask, labels)
        if form == "tuple3"
        else {"input_ids": ids, "attention_mask": mask, "labels": labels}
    )
    f_ref, q_ref = reference(model, ids, mask, labels)
    task = TextClassification()
    weights, buffers = params_of(model)
    torch.testing.assert_close(task.get_outputs(model, batch), f_ref, rtol=1e-9, atol=1e-9)
    q = task.get_out_to_loss_grad(model, weights, buffers, batch)
    torch.testing.assert_close(q, q_ref, rtol=1e-9, atol=1e-12)


def test_dict_sample_under_the_per_sample_entry_matches_the_batch():
    model = bert_classifier(seed=4).double()
    ids, types, mask, labels = bert_data()
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": labels}
    task = TextClassification()
    weights, buffers = params_of(model)
    batched = task.get_outputs(model, batch)
    for i in range(len(ids)):
        one = task.get_output(model, weights, buffers, {k: v[i] for k, v in batch.items()})
        torch.testing.assert_close(one, batched[i], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("attn", [None, "eager"])
def test_bert_under_vmap_is_one_clear_error(attn):
    """BERT's bidirectional mask code reads the mask's values with default and eager attention
    (transformers 5.x), so vmap cannot run it: the error names the hooks engine."""
    model = bert_classifier(attn)
    ids, types, mask, labels = bert_data(2)
    with pytest.raises(ConfigError, match="gradient_engine=hooks"):
        GradientComputer(model, TextClassification()).per_sample_grads((ids, types, mask, labels))


def test_gpt2_classifier_with_eager_attention_runs_under_vmap():
    model = gpt2_classifier("eager", seed=5).double()
    ids, mask = padded_tokens(3, seed=6)
    batch = {"input_ids": ids, "attention_mask": mask, "label": torch.tensor([1, 0, 2])}
    vm = GradientComputer(model, TextClassification()).per_sample_grads(batch)
    it = IterativeGradientComputer(model, TextClassification()).per_sample_grads(batch)
    for k in vm:
        torch.testing.assert_close(vm[k], it[k], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ({"input_ids": torch.ones(2, 3, dtype=torch.long)}, "needs 'labels'"),
        (
            {"input_ids": torch.ones(2, 3), "labels": torch.zeros(2), "label": torch.zeros(2)},
            "both 'labels' and 'label'",
        ),
        ((torch.ones(2, 3), torch.zeros(2)), "a tuple batch is"),
    ],
)
def test_bad_batches_are_config_errors(batch, message):
    with pytest.raises(ConfigError, match=message):
        TextClassification().get_outputs(torch.nn.Identity(), batch)
