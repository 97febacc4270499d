"""``cwlens-masked``: an lm-eval-harness model that scores every request with attention
entries removed (imports lm-eval; :func:`cwlens.lmeval.register` loads this module).

    lm_eval --model cwlens-masked \\
        --model_args pretrained=smollm2-135m,metric=contribution,mode=comprehensiveness,rate=0.3

Per batch of documents: a clean pass ranks the entries ``(layer, head, query i, key j)``
by ``metric`` in every scope unit, then the scored pass runs with the top (or bottom)
``round_half_up(rate * n)`` of each unit removed (``a'_ij = a_ij (1 - m_ij)``). See
:mod:`cwlens.lmeval.scoring` and :mod:`cwlens.lmeval.settings`.

Supported request types: ``loglikelihood`` (multiple-choice and loglikelihood tasks) and
``loglikelihood_rolling`` (perplexity tasks: lm-eval's disjoint rolling windows of
``max_length`` tokens after the prefix token, each window masked on its own input).
``generate_until`` raises :class:`GenerationNotSupportedError`.
"""

import sys

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from cwlens.engine import adapter
from cwlens.engine.batching import token_ids
from cwlens.engine.handle import wrap
from cwlens.engine.models.loading import load_model
from cwlens.errors import CwlensError
from cwlens.faithfulness.passes import SweepStats
from cwlens.lmeval.requests import encode_request, prefix_token_id, token_request
from cwlens.lmeval.scoring import score_requests
from cwlens.lmeval.settings import ModelArgsError, describe, read_model_args

NAME = "cwlens-masked"


def cpu_for_default_cuda(device):
    """lm-eval's own ``--device`` (``cuda:0`` unless given) on a machine without CUDA: the
    CPU, said on stderr (a ``device`` in ``--model_args`` is taken as asked: a CUDA device
    without CUDA is refused there, naming the fix)."""
    if device and str(device).startswith("cuda") and not torch.cuda.is_available():
        print(f"cwlens-masked: lm-eval's device {device!r} is not on this machine (no CUDA): "
              "the model loads on the CPU; put device=... in --model_args to choose.",
              file=sys.stderr)
        return "cpu"
    return device


class GenerationNotSupportedError(CwlensError, NotImplementedError):
    """``generate_until`` under masking is not built (masks are per fixed input)."""


@register_model(NAME)
class CwlensMaskedLM(LM):
    """A TransformerLens model (``cwlens.load_model(pretrained)``) scored under a mask.

    Args: ``pretrained`` (a cwlens short name, local directory or hub id) or ``model``
    (an already loaded TransformerLens model, from Python); the masking options of
    :func:`cwlens.lmeval.settings.masking_config`; ``device``, ``dtype`` (``float32``,
    ``bfloat16``...), ``max_length`` (default ``n_ctx``). lm-eval's ``batch_size`` is
    accepted and ignored: batches hold ``batch_tokens`` padded tokens.
    """

    def __init__(
        self,
        pretrained: str | None = None,
        model=None,
        max_length: int | None = None,
        device: str | None = None,
        dtype: str = "float32",
        progress: bool = True,
        **model_args,
    ):
        super().__init__()
        # every model_arg is checked before the model loads (ModelArgsError: one line, exit 2)
        read = read_model_args({**model_args, "dtype": dtype, "max_length": max_length,
                                "progress": progress})
        self.config = read["config"]
        dtype, max_length, progress = read["dtype"], read["max_length"], read["progress"]
        if model is None:
            if not pretrained:
                raise ModelArgsError("cwlens-masked needs pretrained=<name or directory> in "
                                     "model_args, e.g. --model_args pretrained=smollm2-135m.")

            model = load_model(str(pretrained), device=device, dtype=dtype)  # cuda without one: refused

        handle = wrap(model)
        adapter.require_next_token_model(handle.info, "lm-eval scoring", "Use a decoder model.")
        adapter.require_metrics(handle, self.config.metrics)
        try:
            adapter.resolve_layers(handle.n_layers, list(self.config.layers) if self.config.layers else None)
        except CwlensError as err:
            raise ModelArgsError(
                f"cwlens-masked model_args layers={';'.join(map(str, self.config.layers or ()))}: "
                f"{err} (here: leave layers out, or layers=all).") from err
        self.model = handle.model  # the TransformerLens model (lm-eval reads lm.model)
        self.handle = handle
        self.pretrained = str(pretrained) if pretrained else (handle.name or "model")
        self.max_length = int(max_length or handle.n_ctx)
        self.progress = bool(progress)
        self.stats = SweepStats()

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        """``--model_args`` win over lm-eval's own options (``--device``: lm-eval's
        default is ``cuda:0``; without CUDA the model loads on the CPU)."""
        from lm_eval.utils import simple_parse_args_string  # optional: lm_eval (the lmeval extra)

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        if "device" not in arg_dict:
            extra["device"] = cpu_for_default_cuda(extra.get("device"))
        return cls(**{**extra, **arg_dict})

    def _score(self, requests, groups, disable_tqdm=False):
        return score_requests(self.handle, requests, groups, self.config,
                              progress=self.progress and not disable_tqdm, stats=self.stats)

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        """``[(ll, is_greedy)]`` of each ``(context, continuation)`` under the mask."""
        reqs, groups = [], []
        for i, inst in enumerate(requests):
            context, continuation = inst.args
            ctx, cont = encode_request(self.handle, context, continuation)
            reqs.append(token_request(ctx, cont, self.max_length, i))
            doc = getattr(inst, "doc_id", None)
            groups.append(("doc", inst.task_name, doc) if doc is not None else ("req", i))
        return self._score(reqs, groups, disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        """Summed ``ll`` of each whole text, over lm-eval's disjoint rolling windows."""
        reqs, groups, owner = [], [], []
        prefix = prefix_token_id(self.handle)
        for i, inst in enumerate(requests):
            (text,) = inst.args[:1]
            tokens = token_ids(self.handle, text).tolist()
            if tokens and tokens[0] == prefix:  # the window's prefix token plays the BOS
                tokens = tokens[1:]
            windows = get_rolling_token_windows(tokens, prefix, self.max_length, 1)
            for ctx, cont in map(make_disjoint_window, windows):
                reqs.append(token_request(ctx, cont, self.max_length, i))
                groups.append(("doc", i))
                owner.append(i)
        scores = self._score(reqs, groups, disable_tqdm)
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, scores, strict=True):
            totals[i] += ll
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False):
        raise GenerationNotSupportedError(
            "cwlens-masked scores log-likelihoods only: use multiple_choice, loglikelihood "
            "or loglikelihood_rolling tasks (e.g. cwlens_boolq, cwlens_mmlu, "
            "cwlens_winogrande). Generation under masking would need a new mask for every "
            "generated token; it is not built."
        )

    def get_model_info(self) -> dict:
        return {"model_name": self.pretrained, **describe(self.config)}

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.handle.tokenizer, "name_or_path", self.pretrained)).replace("/", "__")
