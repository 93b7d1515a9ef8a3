import subprocess
import sys
from pathlib import Path

from processor.proto import predict_pb2

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh():
    result = subprocess.run([sys.executable, str(ROOT / "scripts/gen_protos.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_field_numbers_match_deeprec():
    def numbers(msg):
        return {f.name: f.number for f in msg.DESCRIPTOR.fields}

    assert predict_pb2.DESCRIPTOR.package == "tensorflow.eas"
    assert numbers(predict_pb2.ArrayShape) == {"dim": 1}
    assert numbers(predict_pb2.ArrayProto) == {
        "dtype": 1, "array_shape": 2, "float_val": 3, "double_val": 4, "int_val": 5,
        "string_val": 6, "int64_val": 7, "bool_val": 8}
    assert numbers(predict_pb2.PredictRequest) == {"signature_name": 1, "inputs": 2, "output_filter": 3}
    assert numbers(predict_pb2.PredictResponse) == {"outputs": 1}
    assert numbers(predict_pb2.ServingModelInfo) == {"model_path": 1}
    enum = predict_pb2.ArrayDataType
    assert [enum.Name(i) for i in range(22)][-3:] == ["DT_HALF", "DT_RESOURCE", "DT_VARIANT"]
    assert enum.Value("DT_INT64") == 9 and enum.Value("DT_BFLOAT16") == 14


def test_packed_encoding_is_byte_compatible():
    # A DeepRec client's bytes for ArrayProto{DT_FLOAT, [1,1], float_val [1.0]}.
    a = predict_pb2.ArrayProto(dtype=1, array_shape=predict_pb2.ArrayShape(dim=[1, 1]), float_val=[1.0])
    assert a.SerializeToString() == b"\x08\x01\x12\x04\x0a\x02\x01\x01\x1a\x04\x00\x00\x80\x3f"
