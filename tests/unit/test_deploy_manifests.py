"""deploy/kubernetes: every manifest validates offline, and the pieces agree with each other, with
the server and with docs/scaling-out.md.

* Built-in kinds (Deployment, Service, HPA, PDB, ConfigMap, Secret) are validated with the
  kubernetes-validate package in strict mode (unknown fields are errors, as `kubectl apply`'s
  server-side strict field validation makes them) against every Kubernetes version it bundles
  from 1.25 on. It ships the schemas; nothing is fetched.
* KServe's objects (deploy/kubernetes/kserve) are validated against KServe's own CRDs in
  tests/unit/test_deploy_kserve.py.
* The deployment JSON inside the ConfigMap is rendered by the render-config init container's own
  script run as a process: tests/e2e/deploy/test_deploy_render.py.
"""

from __future__ import annotations

import copy
import json
import re

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (dev extra) not installed")

from processor.config import ModelConfig  # noqa: E402
from server.settings import DeploymentConfig  # noqa: E402

from unit.k8s_objects import K8S, KSERVE, ROOT  # noqa: E402
from unit.k8s_objects import container as _container  # noqa: E402
from unit.k8s_objects import deployment as _deployment  # noqa: E402
from unit.k8s_objects import kserve as _kserve  # noqa: E402
from unit.k8s_objects import load as _load  # noqa: E402
from unit.k8s_objects import objects as _objects  # noqa: E402
from unit.k8s_objects import one as _one  # noqa: E402
from unit.k8s_objects import pod as _pod  # noqa: E402
from unit.k8s_objects import server_routes as _server_routes  # noqa: E402
from unit.k8s_objects import template_json as _template_json  # noqa: E402

DOC = ROOT / "docs" / "scaling-out.md"
OLDEST_K8S = "1.25"


def _versions() -> list[str]:
    from kubernetes_validate.utils import all_versions

    out = sorted({".".join(v.split(".")[:2]) for v in all_versions()}, key=lambda v: tuple(map(int, v.split("."))))
    return [v for v in out if tuple(map(int, v.split("."))) >= tuple(map(int, OLDEST_K8S.split(".")))]


# --- schemas ---------------------------------------------------------------------------------


def test_the_directory_holds_what_the_tests_know():
    names = {p.name for p in K8S.glob("*.yaml")}
    assert names == {"configmap.yaml", "deployment.yaml", "service.yaml", "hpa.yaml", "pdb.yaml",
                     "secret.example.yaml", "prometheus-adapter.yaml", "prometheus-adapter-values.yaml",
                     "kustomization.yaml"}
    assert {p.name for p in KSERVE.glob("*.yaml")} == {"servingruntime.yaml", "inferenceservice.yaml"}


@pytest.mark.parametrize("version", _versions())
def test_builtin_kinds_validate_strictly(version):
    objects = _objects()
    assert {d["kind"] for _, d in objects} == {"ConfigMap", "Secret", "Deployment", "Service",
                                                "HorizontalPodAutoscaler", "PodDisruptionBudget"}
    for filename, doc in objects:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(map(str, exc.path))
            pytest.fail(f"{filename} {doc['kind']}/{doc['metadata']['name']} on Kubernetes {version}: "
                        f"{path}: {exc.message}")


def test_strict_validation_can_fail():
    # a misspelt field, a wrong type and a missing required field are each caught
    dep = _deployment()
    typo = copy.deepcopy(dep)
    server = _container(typo["spec"]["template"]["spec"], "server")
    server["readinesProbe"] = server.pop("readinessProbe")
    wrong_type = copy.deepcopy(dep)
    wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "60"
    missing = copy.deepcopy(_one("HorizontalPodAutoscaler"))
    del missing["spec"]["maxReplicas"]
    for bad in (typo, wrong_type, missing):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, _versions()[-1], strict=True)


def test_validation_is_offline(monkeypatch):
    # the schemas are files inside the package: validation opens no connection and resolves no name
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("kubernetes-validate tried to use the network")

    for name in ("connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    for _, doc in _objects():
        kubernetes_validate.validate(doc, _versions()[0], strict=True)
        kubernetes_validate.validate(doc, _versions()[-1], strict=True)


# --- the pieces agree ------------------------------------------------------------------------


def _exported_metrics() -> set[str]:
    source = (ROOT / "server" / "metrics.py").read_text()
    return set(re.findall(r'"(sp_[a-z_]+)"', source))


def test_server_container_matches_the_deployment_json():
    pod = _pod()
    server = _container(pod, "server")
    dep = _template_json()
    args = server["args"]
    assert args[args.index("--host") + 1] == "0.0.0.0" == dep["host"]
    config_path = args[args.index("--config") + 1]
    mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    assert config_path == f"{mounts['config']}/deployment.json"
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"http": dep["http_port"], "grpc": dep["grpc_port"]}
    env = {e["name"]: e for e in server["env"]}
    assert env[dep["admin_token_env"]]["valueFrom"]["secretKeyRef"]["name"] == "serving-processor-secrets"
    # the model store's credentials reach botocore (s3fs) through its own variables
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(env)
    # every ${NAME} of the template is in the init container's environment
    init_env = {e["name"] for e in _container(pod, "render-config", init=True)["env"]}
    assert set(re.findall(r"\$\{(\w+)\}", json.dumps(dep))) == init_env == {"REDIS_PASSWORD"}


def test_probes_are_the_servers_and_the_drain_fits_the_grace_period():
    pod = _pod()
    server = _container(pod, "server")
    routes = _server_routes()
    assert server["readinessProbe"]["httpGet"]["path"] in {"/readyz", "/v2/health/ready"} & routes
    assert server["livenessProbe"]["httpGet"]["path"] in {"/healthz", "/v2/health/live"} & routes
    assert server["startupProbe"]["httpGet"]["path"] in {"/healthz", "/v2/health/live"} & routes
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert server[probe]["httpGet"]["port"] == "http"
    pre_stop = server["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = _template_json()["drain_timeout_seconds"]
    # preStop, then SIGTERM's drain, then a few seconds for the servers and models to close
    assert pod["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + drain + 5
    isvc = _kserve("InferenceService")["spec"]["predictor"]
    assert isvc["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + 30 + 5


def test_secrets_agree_everywhere():
    pod = _pod()
    refs = set()
    for c in pod["containers"] + pod["initContainers"]:
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == "serving-processor-secrets"
                refs.add(ref["key"])
    example = _one("Secret", "serving-processor-secrets")
    assert set(example["stringData"]) == refs
    created = re.findall(r"--from-literal=([A-Z_]+)=", _doc())
    assert sorted(created) == sorted(refs), "docs/scaling-out.md creates another set of secret keys"
    for c in pod["containers"] + pod["initContainers"]:
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                assert ref["key"] in _one("ConfigMap", ref["name"])["data"]


def test_selectors_service_pdb_and_hpa_target_the_pods():
    dep = _deployment()
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert "replicas" not in dep["spec"], "the HPA owns the replica count"
    ports = {p["name"] for p in _container(_pod(), "server")["ports"]}
    services = [d for _, d in _objects() if d["kind"] == "Service"]
    assert len(services) == 2
    for svc in services:
        assert svc["spec"]["selector"].items() <= labels.items()
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports
    pdb = _one("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = _one("HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", dep["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2 and pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"]
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] in _server_routes()
    assert int(annotations["prometheus.io/port"]) == _template_json()["http_port"]


def _adapter_rules() -> list[dict]:
    cm = _one("ConfigMap", "adapter-config")
    return yaml.safe_load(cm["data"]["config.yaml"])["rules"]


def test_hpa_metrics_have_adapter_rules_and_are_exported():
    rules = _adapter_rules()
    assert rules == yaml.safe_load((K8S / "prometheus-adapter-values.yaml").read_text())["rules"]["custom"]
    exposed = {r["name"]["as"] for r in rules}
    exported = _exported_metrics()
    for rule in rules:
        series = re.match(r"([a-z_]+)\{", rule["seriesQuery"]).group(1)
        assert series in exported, f"{series} is not a metric of server/metrics.py"
        assert re.fullmatch(rule["name"]["matches"], series)
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
        assert "<<.Series>>{<<.LabelMatchers>>}" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
    hpa = _one("HorizontalPodAutoscaler")
    for metric in hpa["spec"]["metrics"]:
        assert metric["type"] == "Pods"
        assert metric["pods"]["metric"]["name"] in exposed
    assert {"sp_requests_in_flight", "sp_batch_queue_depth", "sp_model_ready"} <= exported


def test_kustomization_lists_the_core_objects():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kust["kind"] == "Kustomization"
    assert kust["resources"] == ["configmap.yaml", "deployment.yaml", "service.yaml", "hpa.yaml", "pdb.yaml"]
    for name in kust["resources"]:
        assert (K8S / name).is_file()
    for _, doc in _objects():
        assert "namespace" not in doc["metadata"] or doc["metadata"]["name"] == "adapter-config"


# --- docs/scaling-out.md is exact -------------------------------------------------------------


def _doc() -> str:
    return DOC.read_text()


def test_doc_names_only_what_exists():
    doc = _doc()
    # files
    for path in set(re.findall(r"\b((?:deploy|docker|configs|docs|scripts)/[\w./-]+[\w])", doc)):
        assert (ROOT / path).exists(), f"docs/scaling-out.md names {path}, which does not exist"
    # metrics
    exported = _exported_metrics()
    for metric in set(re.findall(r"\b(sp_[a-z_]+)\b", doc)):
        assert metric in exported, f"docs/scaling-out.md names metric {metric}, not exported"
    # HTTP paths the doc calls
    routes = _server_routes()
    patterns = [re.compile("^" + re.sub(r"\\\{[^}]+\\\}", lambda m: ".+" if ":path" in m.group() else "[^/]+",
                                        re.escape(r)) + "$") for r in routes]
    for path in set(re.findall(r"(?<![\w.])(/(?:healthz|readyz|metrics|v1/models|v2/[\w/]+|admin/[\w/]+|api/[\w/]+)[\w/{}:.-]*)", doc)):
        path = path.rstrip(".")
        assert any(p.match(path) for p in patterns), f"docs/scaling-out.md calls {path}, not a route"
    # object names used with kubectl
    names = {(d["kind"].lower(), d["metadata"]["name"]) for _, d in _objects()}
    for kind, name in re.findall(r"\b(deployment|service|hpa|configmap|secret|pdb)/([a-z0-9-]+)", doc):
        kind = {"hpa": "horizontalpodautoscaler", "pdb": "poddisruptionbudget"}.get(kind, kind)
        assert (kind, name) in names, f"docs/scaling-out.md names {kind}/{name}, not in deploy/kubernetes"
    # the server's command line it quotes
    args = _container(_pod(), "server")["args"]
    for config in re.findall(r"--config (/\S+?)`? ", doc):
        assert config == args[args.index("--config") + 1]
    # the labels it selects pods by
    labels = _deployment()["spec"]["template"]["metadata"]["labels"]
    for key, value in re.findall(r"-l ([\w./-]+)=([\w-]+)", doc):
        assert labels.get(key) == value


def test_doc_config_keys_are_config_keys():
    doc = _doc()
    known = set(ModelConfig.model_fields) | set(DeploymentConfig.model_fields) | {"model_config", "name"}
    metrics = _exported_metrics()
    # deployment-entry keys, and values that are not keys
    allowed = {"inference_threads", "version_labels", "cluster_redis", "round_robin"}
    for word in set(re.findall(r"`([a-z]+(?:_[a-z0-9]+)+)`", doc)):
        if word in metrics or word in allowed or word.isupper():
            continue
        assert word in known, f"docs/scaling-out.md: `{word}` is no config key of processor/config.py or server/settings.py"
    # the JSON blocks of the doc are valid model_config / deployment fragments
    for block in re.findall(r"```json\n(.*?)```", doc, re.S):
        data = json.loads(block)
        if "models" in data:
            DeploymentConfig.from_dict(data)
        else:
            ModelConfig.from_dict({"savedmodel_dir": "/m", **data})


# --- the TLS variant (deploy/kubernetes-tls, issue 31) --------------------------------------------

TLS = ROOT / "deploy" / "kubernetes-tls"


def _apply_json6902(doc: dict, ops: list[dict]) -> dict:
    """The ``add`` / ``replace`` operations kustomize applies (RFC 6902, "-" appends)."""
    out = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] in ("add", "replace"), op
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            if last == "-":
                node.append(copy.deepcopy(op["value"]))
            elif op["op"] == "add":
                node.insert(int(last), copy.deepcopy(op["value"]))
            else:
                node[int(last)] = copy.deepcopy(op["value"])
        else:
            assert (last in node) == (op["op"] == "replace"), f"{op['op']} {op['path']}"
            node[last] = copy.deepcopy(op["value"])
    return out


def _tls_objects() -> dict[str, dict]:
    """The overlay's objects: the base's, patched as its kustomization says, plus its own."""
    kust = yaml.safe_load((TLS / "kustomization.yaml").read_text())
    assert kust["resources"][0] == "../kubernetes"
    out = {f"{d['kind']}/{d['metadata']['name']}": d for _, d in _objects()}
    for patch in kust["patches"]:
        target = patch["target"]
        key = f"{target['kind']}/{target['name']}"
        out[key] = _apply_json6902(out[key], yaml.safe_load((TLS / patch["path"]).read_text()))
    for name in kust["resources"][1:]:
        for doc in _load(TLS / name):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


def test_tls_overlay_holds_what_the_tests_know():
    assert {p.name for p in TLS.iterdir()} == {"kustomization.yaml", "certificate.yaml", "deployment-patch.yaml",
                                               "configmap-patch.yaml"}


@pytest.mark.parametrize("version", [OLDEST_K8S, _versions()[-1]])
def test_tls_overlay_validates_strictly(version):
    objects = _tls_objects()
    for key in ("Deployment/serving-processor", "ConfigMap/serving-processor-config"):
        try:
            kubernetes_validate.validate(objects[key], version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"TLS overlay {key} on Kubernetes {version}: {'.'.join(map(str, exc.path))}: {exc.message}")


def test_tls_overlay_pieces_agree():
    objects = _tls_objects()
    pod = objects["Deployment/serving-processor"]["spec"]["template"]
    spec = pod["spec"]
    server, init = _container(spec, "server"), _container(spec, "render-config", init=True)
    cm = objects["ConfigMap/serving-processor-config"]["data"]
    # the init container merges tls.json into the deployment: the result validates
    template_mount = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}["config-template"]
    assert init["args"][3:] == [f"{template_mount}/tls.json"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert {"key": "tls.json", "path": "tls.json"} in volumes["config-template"]["configMap"]["items"]
    data = {**json.loads(cm["deployment.json"]), **json.loads(cm["tls.json"])}
    dep = DeploymentConfig.from_dict(data)
    assert dep.http_tls_on and dep.grpc_tls_on and dep.health_port
    # the files it names are the Secret's keys where the Secret is mounted, the Secret cert-manager fills
    cert = objects["Certificate/serving-processor-tls"]
    assert cert["apiVersion"] == "cert-manager.io/v1" and cert["spec"]["issuerRef"]["name"]
    assert volumes["tls"]["secret"]["secretName"] == cert["spec"]["secretName"]
    assert volumes["tls"]["secret"]["defaultMode"] == 0o440
    mount = {m["name"]: m for m in server["volumeMounts"]}["tls"]
    assert mount["readOnly"]
    for path, key in ((dep.tls_cert_file, "tls.crt"), (dep.tls_key_file, "tls.key"), (dep.tls_client_ca_file, "ca.crt")):
        assert path == f"{mount['mountPath']}/{key}"
    services = {n.split("/")[1] for n in objects if n.startswith("Service/")}
    assert services <= set(cert["spec"]["dnsNames"])
    # the kubelet and Prometheus use the plaintext health port, which serves those paths
    from server.http.health_port import PATHS

    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"http": dep.http_port, "grpc": dep.grpc_port, "health": dep.health_port}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert server[probe]["httpGet"]["port"] == "health" and server[probe]["httpGet"]["path"] in PATHS
    annotations = pod["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == dep.health_port and annotations["prometheus.io/path"] in PATHS


def test_tls_overlay_builds_with_kustomize(tmp_path):
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its built-in kustomize builds the overlay offline)")
    out = subprocess.run([kubectl, "kustomize", str(TLS)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    built = {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(out.stdout) if d}
    ours = _tls_objects()
    assert {"Deployment/serving-processor", "ConfigMap/serving-processor-config",
            "Certificate/serving-processor-tls"} <= set(built) <= set(ours)
    for key, doc in built.items():  # what kustomize made is what the tests above checked
        assert doc == ours[key], key
