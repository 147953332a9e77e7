"""models/final/model.onnx: the trained model as an ONNX graph, which ONNX Runtime (or any ONNX serving stack: Triton,
ONNX Runtime Server) runs with no trainflow, torch or Python of ours.

Preprocessing is in the graph wherever ONNX can express it. Its inputs, per kind of data:

- tables: one input per raw feature column (preprocess.json's `raw_features`), named after it, `rows` long:
  - numeric and boolean (0/1) columns: float64, NaN (or +-inf) for a missing value;
  - categorical columns: string; a value that is not one of the column's `categories` (a missing one: "") counts
    as unknown;
  - datetime columns: int64 nanoseconds since 1970-01-01 UTC, missing = -2**63 (pandas:
    `series.to_numpy("datetime64[ns]").view("int64")`).
  The graph imputes, standardises, adds the missing-value indicators and one-hot codes the categories exactly as
  `Preprocessor.features` does, in float64 as it does (the same float32 features, bit for bit).
- images: `images`, uint8 [rows, channels, height, width]: the image decoded to 8-bit grayscale (preprocess.json's
  image_channels 1) or RGB (3) and resized (bilinear) to its image_size; the graph normalises with its image_mean and
  image_std.
- text: `tokens`, int64 [rows, length], and `mask`, bool [rows, length]: the ids of tokenizer.json (beside it; the
  Hugging Face `tokenizers` format), padded on the right with preprocess.json's pad_id, the mask True on real tokens.
  Tokenising is not an ONNX operator ONNX Runtime has without extensions, so it stays outside.

Its outputs, `rows` long: `scores`, float64, as `trainflow predict` computes them (class probabilities, the softmax is
in the graph; for regression, the value in the target's units); and, for classification, `label`, string: the class
of the highest score (the first on a tie), as `trainflow predict`'s `prediction`.

Why ONNX, and why torch's TorchScript-based exporter: ONNX is what serving stacks load without Python (a
`torch.export` program needs torch to run), and it can hold the preprocessing of strings (a `torch.export` program
cannot). The TorchScript-based exporter traces a model quickly, needs only the `onnx` package and gave mlp, cnn,
text_transformer and text_bag within float32 rounding of torch (benchmarks/onnx-export.md); the dynamo-based one
was many times slower on the MLP and needs onnxscript. Its output is the same bytes for the same weights (so an
unchanged retrain still exports byte for byte, and register adds no version). The tables' preprocessing is written
with `onnx.helper` (strings and NaN tests are not traceable) and joined in front of the traced model.

A model the exporter cannot trace, or whose graph disagrees with torch by more than `TOLERANCE` on the example
batches below (a model whose forward reads values on the host, say: tracing freezes them), gets no model.onnx: the
train stage says so when it trains, and `trainflow predict --runtime onnx` names the reason from training.json. A
regression value is compared in units of the target's standard deviation (`gap`): the model computes in float32 on
the standardised target, so the two runtimes' rounding grows with the target's scale, and a tolerance in the target's
own units would refuse every target measured in hundreds and accept any error on one measured in thousandths.

Text longer than the model was trained on is cut in the graph to preprocess.json's `max_length` ids, as trainflow's
tokenizer cuts it (tokenizer.json truncates there too; a pretrained tokenizer keeps its closing special token, which a
cut in the graph cannot, so encode with tokenizer.json).
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from trainflow.data.preprocess import DATETIME_PARTS, NS_PER_DAY, Preprocessor

ONNX = "model.onnx"
OPSET = 18
ML_OPSET = 2  # ai.onnx.ml: LabelEncoder with string keys
TOLERANCE = 1e-5  # the largest `gap` between ONNX Runtime's scores and torch's accepted on the example batches
NAT = np.iinfo(np.int64).min  # a missing timestamp (pandas' NaT) in a datetime input


class Scores(nn.Module):
    """The model, then what `ExportedModel.outputs` does to its outputs, in the graph; images normalised first."""

    def __init__(self, model: nn.Module, pre: Preprocessor, keys: list[str]) -> None:
        super().__init__()
        self.model, self.keys, self.classification = model, keys, pre.task == "classification"
        self.target_mean, self.target_std = float(pre.target_mean or 0.0), float(pre.target_std or 1.0)
        # Text: the ids trainflow's tokenizer keeps. A longer input would index past the positions a model learnt.
        self.max_length = pre.max_length if pre.text_column is not None and pre.max_length > 0 else None
        self.images = pre.image_column is not None
        if self.images:  # as ImageData normalises: float32 (x - mean) / std, [1, C, 1, 1]
            self.register_buffer("mean", torch.tensor(pre.image_mean, dtype=torch.float32)[None, :, None, None])
            self.register_buffer("std", torch.tensor(pre.image_std, dtype=torch.float32)[None, :, None, None])

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.images:
            mean, std = self.get_buffer("mean"), self.get_buffer("std")
            inputs = ((inputs[0].float() - mean) / std,)
        if self.max_length is not None:  # a Slice in the graph: a no-op up to max_length ids, a cut beyond
            inputs = tuple(t[:, : self.max_length] for t in inputs)
        out = self.model(**dict(zip(self.keys, inputs, strict=True))).double()
        if self.classification:
            return torch.softmax(out, dim=-1)
        return out.reshape(-1) * self.target_std + self.target_mean


def signature(pre: Preprocessor) -> tuple[list[str], list[str], dict[str, dict[int, str]]]:
    """The engine's batch keys, the traced model's input names and their dynamic axes, for this preprocessing."""
    if pre.text_column is not None:
        axes = {0: "rows", 1: "length"}
        return ["tokens", "mask"], ["tokens", "mask"], {"tokens": axes, "mask": axes}
    if pre.image_column is not None:
        return ["images"], ["images"], {"images": {0: "rows"}}
    return ["x"], ["features"], {"features": {0: "rows"}}


def is_table(pre: Preprocessor) -> bool:
    return pre.text_column is None and pre.image_column is None


# --- example inputs --------------------------------------------------------------------------------------------------


def example_frame(pre: Preprocessor, rows: int, rng: np.random.Generator) -> pd.DataFrame:
    """Raw table rows of every feature kind, with missing values, unseen categories and infinities: what the graph's
    preprocessing must treat as `Preprocessor.features` does."""
    data: dict[str, Any] = {}
    missing = np.arange(rows) % 5 == 1
    for c in pre.columns:
        if c.kind == "categorical":
            choices = np.array([*c.categories, "<never seen>"], dtype=object)
            values = choices[rng.integers(0, len(choices), rows)]
            values[missing] = None
            data[c.name] = values
        elif c.kind == "datetime":
            ns = rng.integers(-(10**18), 3 * 10**18, rows)  # 1938 .. 2065, before and after 1970
            ns[missing] = NAT
            data[c.name] = ns.view("datetime64[ns]")
        elif c.kind == "boolean":
            x = rng.integers(0, 2, rows).astype(np.float64)
            x[missing] = np.nan
            data[c.name] = x
        else:
            x = c.center[0] + c.scale[0] * rng.standard_normal(rows)
            x[missing] = np.nan
            x[np.arange(rows) % 7 == 3] = np.inf  # missing too
            data[c.name] = x
    return pd.DataFrame(data, index=pd.RangeIndex(rows))


def example_batches(
    pre: Preprocessor, config: dict[str, Any]
) -> list[tuple[dict[str, np.ndarray], list[torch.Tensor]]]:
    """(the graph's feed, the traced model's inputs) of the shapes a model meets: 1, 3 and 17 rows; text of 1, 5 and
    11 tokens (at most the model's longest sequence) with rows padded to the longest, and 2 rows of 3 ids more than
    the graph keeps (it cuts them). Random: the check is that the graph computes what torch computes, not that the
    values mean anything."""
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    batches: list[tuple[dict[str, np.ndarray], list[torch.Tensor]]] = []
    hf_config = config.get("hf_config", {})
    longest = int(config.get("max_len") or hf_config.get("max_position_embeddings") or 11)
    shapes = [(1, 1), (3, min(5, longest)), (17, min(11, longest))]
    if pre.text_column is not None and pre.max_length > 0:
        shapes.append((2, pre.max_length + 3))
    for rows, length in shapes:
        if pre.text_column is not None:
            vocab = int(config.get("vocab_size") or hf_config.get("vocab_size") or 2)
            lengths = torch.randint(1, length + 1, (rows,), generator=g)
            lengths[0] = length
            mask = torch.arange(length)[None, :] < lengths[:, None]
            tokens = torch.where(mask, torch.randint(1, max(2, min(vocab, 1000)), (rows, length), generator=g),
                                 pre.pad_id)  # fmt: skip
            batches.append(({"tokens": tokens.numpy(), "mask": mask.numpy()}, [tokens, mask]))
        elif pre.image_column is not None:
            height, width = pre.image_size
            images = torch.randint(0, 256, (rows, pre.image_channels, height, width), generator=g, dtype=torch.uint8)
            batches.append(({"images": images.numpy()}, [images]))
        else:
            frame = example_frame(pre, rows, rng)
            batches.append((pre.typed_columns(frame), [torch.from_numpy(pre.features(frame, "example rows"))]))
    return batches


# --- the graph -------------------------------------------------------------------------------------------------------


def _table_preprocessing(pre: Preprocessor, ir_version: int) -> Any:
    """An ONNX model from the raw feature columns to `pre/features`, float32 [rows, width], as `Preprocessor.features`
    computes it: per column, impute (Where), standardise in float64, cast, add the indicator; one-hot the categories
    (LabelEncoder to the category's index, unknown last, then OneHot)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes: list[Any] = []
    inits: list[Any] = []
    inputs: list[Any] = []
    blocks: list[str] = []

    made: set[str] = set()

    def const(name: str, value: Any) -> str:  # one initializer per name: a name always holds the same value
        if f"pre/{name}" not in made:
            made.add(f"pre/{name}")
            inits.append(numpy_helper.from_array(np.asarray(value), f"pre/{name}"))
        return f"pre/{name}"

    def node(op: str, ins: list[str], out: str, domain: str = "", **attrs: Any) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=out, domain=domain, **attrs))
        return out

    axis1 = const("axis1", np.array([1], dtype=np.int64))
    for i, c in enumerate(pre.columns):
        p = f"pre/{i}"  # names from the column's index: a column name may hold any character
        if c.kind == "categorical":
            inputs.append(helper.make_tensor_value_info(c.name, TensorProto.STRING, ["rows"]))
            keys = c.categories or ["\x00trainflow: no category kept"]  # none kept: every value is unknown (0)
            codes = node("LabelEncoder", [c.name], f"{p}/codes", domain="ai.onnx.ml", keys_strings=keys,
                         values_int64s=list(range(len(keys))), default_int64=len(c.categories))  # fmt: skip
            onoff = const(f"{i}/onoff", np.array([0.0, 1.0], dtype=np.float32))
            depth = const(f"{i}/depth", np.array(len(c.categories) + 1, dtype=np.int64))
            blocks.append(node("OneHot", [codes, depth, onoff], f"{p}/onehot", axis=-1))
            continue
        if c.kind == "datetime":
            inputs.append(helper.make_tensor_value_info(c.name, TensorProto.INT64, ["rows"]))
            values, missing = _datetime_parts(c.name, p, node, const)
        else:
            inputs.append(helper.make_tensor_value_info(c.name, TensorProto.DOUBLE, ["rows"]))
            x = node("Unsqueeze", [c.name, axis1], f"{p}/x")
            missing = node("Or", [node("IsNaN", [x], f"{p}/nan"), node("IsInf", [x], f"{p}/inf")], f"{p}/missing")
            values = x
        filled = node("Where", [missing, const(f"{i}/fill", np.asarray(c.fill, dtype=np.float64)), values],
                      f"{p}/filled")  # fmt: skip
        centred = node("Sub", [filled, const(f"{i}/center", np.asarray(c.center, dtype=np.float64))], f"{p}/centred")
        scaled = node("Div", [centred, const(f"{i}/scale", np.asarray(c.scale, dtype=np.float64))], f"{p}/scaled")
        blocks.append(node("Cast", [scaled], f"{p}/value", to=TensorProto.FLOAT))
        if c.indicator:
            blocks.append(node("Cast", [missing], f"{p}/indicator", to=TensorProto.FLOAT))
    node("Concat", blocks, "pre/features", axis=1)
    graph = helper.make_graph(
        nodes, "trainflow preprocessing", inputs,
        [helper.make_tensor_value_info("pre/features", TensorProto.FLOAT, ["rows", pre.width])], inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("ai.onnx.ml", ML_OPSET)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)


def _datetime_parts(name: str, p: str, node: Any, const: Any) -> tuple[str, str]:
    """float64 [rows, 6] year, month, day of week (Monday 0), day, hour, days since 1970 (fractional) of int64 UTC
    nanoseconds, as pandas computes them; and the missing mask [rows, 1]. The calendar is Howard Hinnant's
    days-to-civil algorithm (proleptic Gregorian) in int64: its divisions have non-negative operands except the two
    written with floor division."""
    from onnx import TensorProto

    steps = iter(range(1_000))

    def op(kind: str, a: str, b: str | int, **attrs: Any) -> str:
        """`a kind b`; an int b is an int64 constant."""
        step = next(steps)
        if isinstance(b, int):
            b = const(f"{p[4:]}/const/{step}", np.array(b, dtype=np.int64))
        return node(kind, [a, b], f"{p}/{step}", **attrs)

    def floordiv(a: str, b: int) -> str:  # int64 Div truncates: take off the floor remainder first
        return op("Div", op("Sub", a, op("Mod", a, b, fmod=0)), b)

    nat = op("Equal", name, int(NAT))
    ns = node("Where", [nat, const(f"{p[4:]}/const/zero", np.array(0, dtype=np.int64)), name], f"{p}/ns")
    days = floordiv(ns, NS_PER_DAY)
    hour = op("Div", op("Mod", ns, NS_PER_DAY, fmod=0), 3600 * 10**9)
    dow = op("Mod", op("Add", days, 3), 7, fmod=0)  # 1970-01-01 was a Thursday
    z = op("Add", days, 719468)  # days since 0000-03-01
    era = floordiv(z, 146097)  # 400-year eras
    doe = op("Sub", z, op("Mul", era, 146097))  # day of era, 0..146096
    yoe = op("Div", op("Sub", op("Add", op("Sub", doe, op("Div", doe, 1460)), op("Div", doe, 36524)),
                       op("Div", doe, 146096)), 365)  # year of era, 0..399  # fmt: skip
    doy = op("Sub", doe, op("Sub", op("Add", op("Mul", yoe, 365), op("Div", yoe, 4)), op("Div", yoe, 100)))
    mp = op("Div", op("Add", op("Mul", doy, 5), 2), 153)  # month from March, 0..11
    day = op("Add", op("Sub", doy, op("Div", op("Add", op("Mul", mp, 153), 2), 5)), 1)
    month = node("Where", [op("Less", mp, 10), op("Add", mp, 3), op("Sub", mp, 9)], f"{p}/month")
    january_or_february = node("Cast", [op("LessOrEqual", month, 2)], f"{p}/carry", to=TensorProto.INT64)
    year = op("Add", op("Add", yoe, op("Mul", era, 400)), january_or_february)
    nanoseconds = node("Cast", [ns], f"{p}/nsf", to=TensorProto.DOUBLE)
    fractional = node("Div", [nanoseconds, const(f"{p[4:]}/const/dayns", np.array(float(NS_PER_DAY)))], f"{p}/days")
    axis1 = const(f"{p[4:]}/const/axis", np.array([1], dtype=np.int64))
    parts = [year, month, dow, day, hour]
    assert len(parts) + 1 == len(DATETIME_PARTS)
    columns = [node("Unsqueeze", [node("Cast", [v], f"{v}/f", to=TensorProto.DOUBLE), axis1], f"{v}/col")
               for v in parts] + [node("Unsqueeze", [fractional, axis1], f"{fractional}/col")]  # fmt: skip
    values = node("Concat", columns, f"{p}/parts", axis=1)
    return values, node("Unsqueeze", [nat, axis1], f"{p}/missing")


def _with_label(graph: Any, pre: Preprocessor) -> Any:
    """Classification: add the output `label`, the class name of the highest score (ArgMax takes the first)."""
    from onnx import TensorProto, helper, numpy_helper

    classes = numpy_helper.from_array(np.array(pre.classes, dtype=object), "post/classes")
    graph.graph.initializer.append(classes)
    graph.graph.node.extend([
        helper.make_node("ArgMax", ["scores"], ["post/index"], name="post/index", axis=1, keepdims=0),
        helper.make_node("Gather", ["post/classes", "post/index"], ["label"], name="post/label", axis=0),
    ])  # fmt: skip
    graph.graph.output.append(helper.make_tensor_value_info("label", TensorProto.STRING, ["rows"]))
    return graph


def _graph(scores: Scores, pre: Preprocessor, example: list[torch.Tensor]) -> bytes:
    """The whole graph: the traced model (inputs `signature`'s names, output `scores`), the tables' preprocessing in
    front of it, the label after it."""
    import onnx
    import onnx.compose

    _, names, axes = signature(pre)
    with warnings.catch_warnings(), tempfile.TemporaryDirectory() as tmp:
        warnings.simplefilter("ignore")  # tracer warnings: the parity check in to_onnx is what decides
        torch.onnx.export(
            scores, tuple(example), Path(tmp) / ONNX, input_names=names, output_names=["scores"],
            dynamic_axes={**axes, "scores": {0: "rows"}}, opset_version=OPSET, dynamo=False,
        )  # fmt: skip
        model = onnx.load_from_string((Path(tmp) / ONNX).read_bytes())
    if is_table(pre):
        outputs = ("scores", "label") if pre.task == "classification" else ("scores",)
        taken = [n for n in pre.raw_features if n in outputs or n.startswith(("pre/", "post/"))]
        if taken:
            raise ValueError(f"feature column {taken[0]!r} has a name the graph uses itself (its outputs are "
                             f"{' and '.join(outputs)}); rename the column")  # fmt: skip
        front = _table_preprocessing(pre, model.ir_version)
        model = onnx.compose.merge_models(
            front, model, io_map=[("pre/features", "features")], producer_name="trainflow"
        )
    if pre.task == "classification":
        model = _with_label(model, pre)
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def gap(got: np.ndarray, expected: np.ndarray, pre: Preprocessor) -> float:
    """The largest difference between ONNX Runtime's scores (`got`) and torch's, as the parity check measures it.
    Probabilities: absolute. Regression values: in units of the target's standard deviation, and relative to the
    standardised value where it exceeds one (float32's rounding in the model grows with what it computes)."""
    if not expected.size:
        return 0.0
    difference = np.abs(np.asarray(got, dtype=np.float64) - expected)
    if pre.task == "classification":
        return float(np.max(difference))
    std = float(pre.target_std or 1.0)
    return float(np.max(difference / (std * np.maximum(1.0, np.abs(expected - pre.target_mean) / std))))


def units(pre: Preprocessor) -> str:
    """What `gap` is measured in, for messages."""
    return "" if pre.task == "classification" else " of the target's standard deviation"


def to_onnx(model: nn.Module, pre: Preprocessor, config: dict[str, Any]) -> tuple[bytes | None, str]:
    """The ONNX graph of `model` (on the CPU, in eval mode) with its largest difference from torch (`gap`) on the
    example batches; or None and why not."""
    try:
        import onnxruntime
    except ImportError as exc:
        return None, f"{exc.name} is not installed (pip install onnx onnxruntime)"
    keys, _, _ = signature(pre)
    scores = Scores(model, pre, keys).eval()
    try:
        batches = example_batches(pre, config)
        graph = _graph(scores, pre, batches[1][1])
        session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
        worst = 0.0
        with torch.no_grad():
            for feed, inputs in batches:
                expected = scores(*inputs).numpy()
                got = session.run(None, feed)
                worst = max(worst, gap(got[0], expected, pre))
                if pre.task == "classification" and not np.array_equal(
                    got[1].astype(str), np.asarray(pre.classes)[np.argmax(got[0], axis=1)]
                ):
                    return None, "the graph's label is not the class of its highest score"
    except Exception as exc:  # the exporter and ONNX Runtime raise many kinds; each means "not exportable"
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        return None, f"the exporter failed: {type(exc).__name__}: {first}"
    if not worst <= TOLERANCE:
        return None, f"ONNX Runtime's outputs differ from torch's by {worst:.2e}{units(pre)} (more than {TOLERANCE:g})"
    return graph, f"max |ONNX Runtime - torch| {worst:.1e}{units(pre)} on the example batches"


class OnnxModel:
    """models/final/model.onnx in ONNX Runtime. `raw`: the graph preprocesses a table's raw columns itself (else it
    takes the engine's batch: text, images, and tables exported before the preprocessing moved into the graph)."""

    def __init__(self, graph: bytes, pre: Preprocessor) -> None:
        import onnxruntime

        self.session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
        self.keys, self.names, _ = signature(pre)
        # A table's raw columns are 1-d inputs; graphs from before take the 2-d `features` matrix.
        self.raw = is_table(pre) and all(len(i.shape) == 1 for i in self.session.get_inputs())
        # Graphs from before the normalisation moved in take normalised float32 images.
        self.normalised = pre.image_column is not None and self.session.get_inputs()[0].type == "tensor(float)"

    def feed(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        """`scores` for a feed of the graph's own inputs."""
        (out,) = self.session.run(["scores"], feed)
        return np.asarray(out)

    def __call__(self, **inputs: torch.Tensor) -> np.ndarray:
        """`scores` for a batch of the engine's (images: not normalised, 0-255)."""
        feed = {name: inputs[key].cpu().numpy() for key, name in zip(self.keys, self.names, strict=True)}
        if "images" in feed and not self.normalised:
            feed["images"] = feed["images"].astype(np.uint8)
        return self.feed(feed)
