"""Write the inputs processor_host needs for the demo CTR model: a model_config JSON file and a
serialized tensorflow.eas.PredictRequest (checked against the in-process Python path).

    .venv/bin/python cpp_processor/examples/make_demo_inputs.py [--preset small|full]
        [--batch 4] [--out artifacts/c_abi_demo]

Builds the demo model first if it is not built (artifacts/demo, or artifacts/demo-<preset>).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=["small", "full"], default="small")
    ap.add_argument("--batch", type=int, default=4, help="examples in the request")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=REPO / "artifacts" / "c_abi_demo")
    args = ap.parse_args()

    from demo.paths import DEFAULT_DEMO_DIR, demo_model_config, ensure_demo_model
    from demo.synthetic_data import synthetic_batch
    from processor import abi
    from processor.codec import encode_request

    model_dir = DEFAULT_DEMO_DIR if args.preset == "full" else DEFAULT_DEMO_DIR.with_name(f"demo-{args.preset}")
    paths = ensure_demo_model(model_dir, preset=args.preset)
    config = json.dumps(demo_model_config(paths), indent=2)
    request = encode_request(synthetic_batch(args.batch, args.seed))

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "model_config.json").write_text(config + "\n")
    (args.out / "request.pb").write_bytes(request)
    handle = abi.initialize("", config)
    try:
        status, response = abi.process(handle, request)
    finally:
        abi.finalize(handle)
    if status != 200:
        sys.exit(f"the Python path answered {status}: {response.decode(errors='replace')}")
    print(f"wrote {args.out}/model_config.json and request.pb ({len(request)} bytes, batch {args.batch}; "
          f"the response is {len(response)} bytes)")


if __name__ == "__main__":
    main()
