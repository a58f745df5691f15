"""Reference side of crates/models/tests/suite/gguf_dequant.rs, using the `gguf`
PyPI package (llama.cpp's gguf-py). Run with the python of scripts/python-env.

  gguf_dequant.py file MODEL OUT_DIR MAX_ELEMENTS [EXTRA_TENSOR ...]
      Writes OUT_DIR/manifest.json (version, counts, every metadata value,
      every tensor info) and, for the smallest tensor of each type present plus
      the EXTRA_TENSORs, the dequantized first rows (at most MAX_ELEMENTS
      values) as raw little-endian f32 in OUT_DIR/<n>.f32.

  gguf_dequant.py raw DIR
      For every DIR/<TYPE>.bin (raw blocks of ggml type TYPE) writes
      DIR/<TYPE>.f32 with gguf.quants.dequantize's output.

Floats in the manifest are given as their IEEE bit patterns so the Rust side
can compare exactly (and NaN/inf survive JSON).
"""

import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType, GGUFValueType

TYPE_NAMES = {
    GGUFValueType.UINT8: "u8",
    GGUFValueType.INT8: "i8",
    GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16",
    GGUFValueType.UINT32: "u32",
    GGUFValueType.INT32: "i32",
    GGUFValueType.UINT64: "u64",
    GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT32: "f32",
    GGUFValueType.FLOAT64: "f64",
    GGUFValueType.BOOL: "bool",
    GGUFValueType.STRING: "string",
}


def encode(values: np.ndarray, ty: GGUFValueType) -> list:
    """Scalars of one type as JSON-safe numbers (floats as bit patterns)."""
    if ty == GGUFValueType.FLOAT32:
        return values.astype(np.float32).view(np.uint32).tolist()
    if ty == GGUFValueType.FLOAT64:
        return values.astype(np.float64).view(np.uint64).tolist()
    if ty == GGUFValueType.BOOL:
        return [bool(v) for v in values.tolist()]
    return values.tolist()


class Reader(gguf.GGUFReader):
    """gguf.GGUFReader with its memmap seen as a plain ndarray (same memory,
    no copy). The parsing code is the package's own; this only skips numpy's
    memmap bookkeeping on each of the reader's ~10^6 tiny slices, which makes
    Gemma's 262k-token vocabulary parse about 3x faster."""

    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._data = value.view(np.ndarray)


def field_json(field: gguf.ReaderField) -> dict:
    ty = field.types[0]
    if ty == GGUFValueType.ARRAY:
        if len(field.types) > 2:
            raise SystemExit(f"nested arrays not handled: {field.name}")
        elem = field.types[1] if len(field.types) > 1 else GGUFValueType.UINT32
        if elem == GGUFValueType.STRING:
            value = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        elif len(field.data) == 0:
            value = []
        else:
            value = encode(np.concatenate([field.parts[i] for i in field.data]), elem)
        return {"type": "array", "elem": TYPE_NAMES[elem], "value": value}
    if ty == GGUFValueType.STRING:
        return {"type": "string", "value": bytes(field.parts[-1]).decode("utf-8")}
    return {"type": TYPE_NAMES[ty], "value": encode(field.parts[-1], ty)[0]}


def dump_file(model: str, out_dir: str, max_elements: int, extra: list) -> None:
    reader = Reader(model)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    manifest = {
        "version": int(reader.fields["GGUF.version"].parts[-1][0]),
        "tensor_count": int(reader.fields["GGUF.tensor_count"].parts[-1][0]),
        "kv_count": int(reader.fields["GGUF.kv_count"].parts[-1][0]),
        "alignment": int(reader.alignment),
        "data_offset": int(reader.data_offset),
        "metadata": {k: field_json(f) for k, f in fields.items()},
        "tensors": [
            {
                "name": t.name,
                "type": int(t.tensor_type),
                "dims": [int(d) for d in t.shape],
                "offset": int(t.data_offset),
                "n_bytes": int(t.n_bytes),
            }
            for t in reader.tensors
        ],
        "checked": [],
    }

    smallest = {}
    for t in reader.tensors:
        best = smallest.get(t.tensor_type)
        if best is None or t.n_bytes < best.n_bytes:
            smallest[t.tensor_type] = t
    by_name = {t.name: t for t in reader.tensors}
    chosen = list(smallest.values())
    names = {t.name for t in chosen}
    chosen += [by_name[name] for name in extra if name not in names]

    for i, t in enumerate(chosen):
        row_len = int(t.shape[0])
        rows = t.data.reshape(-1, t.data.shape[-1])
        n_rows = max(1, min(rows.shape[0], max_elements // row_len))
        values = gguf.quants.dequantize(rows[:n_rows], t.tensor_type)
        values = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
        assert values.size == n_rows * row_len, (t.name, values.shape)
        path = os.path.join(out_dir, f"{i}.f32")
        values.tofile(path)
        manifest["checked"].append(
            {
                "name": t.name,
                "type": GGMLQuantizationType(t.tensor_type).name,
                "rows": n_rows,
                "elements": int(values.size),
                "file": path,
            }
        )

    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def dequantize_raw(directory: str) -> None:
    for entry in sorted(os.listdir(directory)):
        if not entry.endswith(".bin"):
            continue
        ty = GGMLQuantizationType[entry[: -len(".bin")]]
        data = np.fromfile(os.path.join(directory, entry), dtype=np.uint8)
        _, type_size = gguf.GGML_QUANT_SIZES[ty]
        values = gguf.quants.dequantize(data.reshape(-1, type_size), ty)
        np.ascontiguousarray(values, dtype="<f4").reshape(-1).tofile(
            os.path.join(directory, entry[: -len(".bin")] + ".f32")
        )


def main() -> None:
    mode = sys.argv[1]
    if mode == "file":
        dump_file(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:])
    elif mode == "raw":
        dequantize_raw(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
