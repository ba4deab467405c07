#!/usr/bin/env python3
"""The chart's platform checks, run by scripts/validate-chart.sh after its own (it passes the
tools and the etcd-steward binary). Each check renders what it needs and names the broken
constraint:

  1. side by side: two releases (and a Bitnami etcd's pods) in one namespace; every selector
     of each (Services, PodDisruptionBudget, StatefulSet, anti-affinity, spread,
     NetworkPolicy, ServiceMonitor, PodMonitor) selects its own pods and nothing else; no name
     is rendered twice; Helm's labels on metadata only, never in a selector or a pod's labels
  2. subchart: an umbrella chart (made under target/) with `global:` values and a Service of its
     own named after the release lints and renders, no name twice (the subchart's are
     <release>-etcd-steward), global.imageRegistry, imagePullSecrets and storageClass honoured;
     the extension points (registry, digest, sidecars, initContainers, spread as a list,
     Service and claim annotations, grace period, runtime class, host aliases, prometheus.io
     annotations from values) land where they should
  3. NetworkPolicy: its ports are exactly the ports the pods open (containerPorts) and the
     agent serves (--http-port, --peer-report-port, --client-port, --peer-port as the binary
     defaults them, etcd's --listen-metrics-urls), with and without TLS, chart and base; the
     peer ports only from this release's pods; anyone only the probe/metrics ports
  4. control token: a Secret of 48 random characters, mounted read-only in both containers
     at the path ETCD_STEWARD_CONTROL_TOKEN_FILE names; existingSecret; off
  5. backups: the drill's scratch volume and the sidecar's memory limit follow the quota, and
     the kustomize backup overlays agree; workload identity (no static keys), gs:// and az://
  6. the platform values land where they should; every agent option given exists
  7. NOTES.txt and the etcdctl commands of README.md and docs/**/*.md reach etcd where it
     listens (the pod's address, with the TLS flags when TLS is on), never 127.0.0.1
  8. RBAC: the Role grants exactly the API calls src/kube_api/ makes
  9. alerts: every description ends with its runbook, docs/operations/alerts.md#<alert>, its
     runbook_url is docs/operations/triage.md#<alert> (an anchor there; metrics.runbookBaseUrl
     before it), no aggregation or match drops namespace, and
     that document's Alerts table has a row for every alert carrying that anchor; they select
     the job the chart's ServiceMonitor and PodMonitor give (or metrics.alertSelector)
 10. the etcd container's startup and liveness probes ask etcd itself on its metrics port
     (/livez where the release has it, else a TCP connection), for each etcd release's tag;
     the sidecar's probes ask the sidecar; a digest without etcd.version fails the render

Usage: chart-checks.py OUT CHART HELM KUBECTL BIN (validate-chart.sh passes them).
"""
import base64
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

out, chart, helm, kubectl, binary = sys.argv[1:6]
problems = []


def problem(msg):
    problems.append(msg)


def docs_of(text):
    return [d for d in yaml.safe_load_all(text) if d]


def template(release, *args, ns="etcd", chart_dir=None):
    r = subprocess.run([helm, "template", release, chart_dir or chart, "--namespace", ns, *args],
                       capture_output=True, text=True)
    if r.returncode:
        problem(f"helm template {release} {' '.join(args)} failed: {r.stderr.strip()}")
        return []
    return docs_of(r.stdout)


def kustomize(path):
    r = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True)
    if r.returncode:
        problem(f"kubectl kustomize {path} failed: {r.stderr.strip()}")
        return []
    return docs_of(r.stdout)


def one(docs, kind, where):
    found = [d for d in docs if d["kind"] == kind]
    if len(found) != 1:
        problem(f"{where}: {len(found)} {kind}s, want one")
        return None
    return found[0]


def sts_parts(docs, where):
    sts = one(docs, "StatefulSet", where)
    if sts is None:
        return None, None, {}
    pod = sts["spec"]["template"]["spec"]
    return sts, pod, {c["name"]: c for c in pod["containers"]}


def env_of(c):
    return {e["name"]: e for e in c.get("env", [])}


def selects(selector, labels):
    """Whether a Service selector (a map) or a LabelSelector selects these labels."""
    if selector is None:
        return False
    if "matchLabels" in selector or "matchExpressions" in selector:
        match = selector.get("matchLabels") or {}
        exprs = selector.get("matchExpressions") or []
    else:
        match, exprs = selector, []
    if not match and not exprs:
        return True
    for k, v in match.items():
        if labels.get(k) != v:
            return False
    for e in exprs:
        k, op, vals = e["key"], e["operator"], e.get("values", [])
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and labels.get(k) in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


def pod_selectors(docs):
    """Every selector of pods in a rendering, as (where, selector)."""
    found = []
    for d in docs:
        kind, name, spec = d["kind"], d["metadata"]["name"], d.get("spec", {})
        if kind == "Service":
            found.append((f"Service/{name}", spec["selector"]))
        elif kind in ("PodDisruptionBudget", "StatefulSet", "PodMonitor"):
            found.append((f"{kind}/{name}", spec["selector"]))
        elif kind == "NetworkPolicy":
            found.append((f"NetworkPolicy/{name} podSelector", spec["podSelector"]))
            for i, rule in enumerate(spec.get("ingress", [])):
                for peer in rule.get("from", []):
                    # A peer with only a podSelector of labels: meant to be this release's pods.
                    if set(peer) == {"podSelector"} and peer["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/instance"):
                        found.append((f"NetworkPolicy/{name} ingress[{i}]", peer["podSelector"]))
        if kind == "StatefulSet":
            pod = spec["template"]["spec"]
            aff = pod.get("affinity", {}).get("podAntiAffinity", {})
            for t in aff.get("requiredDuringSchedulingIgnoredDuringExecution", []):
                found.append((f"StatefulSet/{name} anti-affinity", t["labelSelector"]))
            for t in aff.get("preferredDuringSchedulingIgnoredDuringExecution", []):
                found.append((f"StatefulSet/{name} anti-affinity", t["podAffinityTerm"]["labelSelector"]))
            for t in pod.get("topologySpreadConstraints", []):
                found.append((f"StatefulSet/{name} topologySpread", t["labelSelector"]))
    return found


# ---- 1. two releases side by side ---------------------------------------------------------
# With the ServiceMonitor, and the PodMonitor from a second rendering (the chart refuses both).
releases = {r: template(r, "--set", "metrics.serviceMonitor.enabled=true")
            + [d for d in template(r, "--set", "metrics.podMonitor.enabled=true") if d["kind"] == "PodMonitor"]
            for r in ("etcd", "etcd-b")}
bitnami = {"app.kubernetes.io/name": "etcd", "app.kubernetes.io/instance": "etcd", "app.kubernetes.io/component": "etcd"}
pods = {}
for r, docs in releases.items():
    sts, pod, cs = sts_parts(docs, r)
    if sts:
        pods[r] = sts["spec"]["template"]["metadata"]["labels"]
if len(pods) == 2:
    for r, docs in releases.items():
        sels = pod_selectors(docs)
        kinds = {w.split("/")[0].split(" ")[0] for w, _ in sels}
        if not {"Service", "PodDisruptionBudget", "StatefulSet", "NetworkPolicy", "PodMonitor"} <= kinds:
            problem(f"side by side: release {r} renders selectors of {sorted(kinds)} only")
        for where, sel in sels:
            if not selects(sel, pods[r]):
                problem(f"side by side: {where} of release {r} does not select its own pods")
            for other, labels in [(o, pods[o]) for o in pods if o != r] + [("a Bitnami etcd", bitnami)]:
                if selects(sel, labels):
                    problem(f"side by side: {where} of release {r} selects the pods of {other} ({labels})")
            for k in ("helm.sh/chart", "app.kubernetes.io/managed-by"):
                if k in (sel.get("matchLabels", sel) or {}):
                    problem(f"side by side: {where} of release {r} selects by {k}, which changes with the chart")
        sm = one(docs, "ServiceMonitor", r)
        if sm:
            for o, odocs in releases.items():
                for svc in (d for d in odocs if d["kind"] == "Service"):
                    picked = selects(sm["spec"]["selector"], svc["metadata"]["labels"])
                    want = o == r and svc["spec"].get("clusterIP") == "None"
                    if picked != want:
                        problem(f"side by side: ServiceMonitor of {r} {'selects' if picked else 'misses'} Service {svc['metadata']['name']} of {o}")
        for d in docs:
            labels = d["metadata"].get("labels", {})
            if labels.get("app.kubernetes.io/managed-by") != "Helm" or not labels.get("helm.sh/chart", "").startswith("etcd-steward-"):
                problem(f"labels: {d['kind']}/{d['metadata']['name']} of {r} lacks managed-by: Helm or helm.sh/chart")
            if labels.get("app.kubernetes.io/instance") != r:
                problem(f"labels: {d['kind']}/{d['metadata']['name']} of {r} has instance {labels.get('app.kubernetes.io/instance')!r}")
        if "helm.sh/chart" in pods[r] or "app.kubernetes.io/managed-by" in pods[r]:
            problem(f"labels: the pods of {r} carry Helm's labels (every chart upgrade would restart them)")
    names = [{(d["kind"], d["metadata"]["name"]) for d in docs} for docs in releases.values()]
    if names[0] & names[1]:
        problem(f"side by side: both releases render {sorted(names[0] & names[1])}")
# podLabels reach the pods but never a selector (a new label would need a new StatefulSet).
docs = template("etcd", "--set", "podLabels.team=platform")
sts, pod, cs = sts_parts(docs, "podLabels")
if sts and (sts["spec"]["template"]["metadata"]["labels"].get("team") != "platform"
            or any("team" in (s.get("matchLabels", s) or {}) for _, s in pod_selectors(docs))):
    problem("podLabels: want the label on the pods and in no selector")

# ---- 2. as a subchart, with global values -------------------------------------------------
umbrella = f"{out}/umbrella"
shutil.rmtree(umbrella, ignore_errors=True)
os.makedirs(f"{umbrella}/charts")
os.makedirs(f"{umbrella}/templates")
with open(f"{umbrella}/templates/configmap.yaml", "w") as t:
    t.write("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-platform\ndata:\n  registry: {{ .Values.global.imageRegistry | quote }}\n")
# The parent's own Service named after the release, as charts name theirs.
with open(f"{umbrella}/templates/service.yaml", "w") as t:
    t.write("apiVersion: v1\nkind: Service\nmetadata:\n  name: {{ .Release.Name }}\nspec:\n  ports:\n    - port: 80\n")
shutil.copytree(chart, f"{umbrella}/charts/etcd-steward")
version = yaml.safe_load(open(f"{chart}/Chart.yaml"))["version"]
yaml.safe_dump({"apiVersion": "v2", "name": "platform", "version": "1.0.0", "description": "A platform chart with etcd-steward in it.",
                "icon": "https://example.com/platform.svg",
                "dependencies": [{"name": "etcd-steward", "version": version}]}, open(f"{umbrella}/Chart.yaml", "w"))
yaml.safe_dump({"global": {"imageRegistry": "registry.example.com", "storageClass": "fast-ssd",
                           "imagePullSecrets": ["platform-pull", {"name": "shared-pull"}]},
                "etcd-steward": {"replicas": 5, "initialReplicas": 5}}, open(f"{umbrella}/values.yaml", "w"))
r = subprocess.run([helm, "lint", "--strict", umbrella], capture_output=True, text=True)
if r.returncode:
    problem(f"subchart: helm lint --strict of an umbrella chart with global values failed: {r.stdout.strip()} {r.stderr.strip()}")
docs = template("platform", chart_dir=umbrella)
sts, pod, cs = sts_parts(docs, "subchart")
if sts and (sts["spec"]["replicas"] != 5 or sts["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/instance") != "platform"):
    problem("subchart: the umbrella's values do not reach the StatefulSet (replicas 5, instance platform)")
names = [(d["kind"], d["metadata"]["name"]) for d in docs]
if len(names) != len(set(names)):
    problem(f"subchart: names rendered twice beside the parent's own: {sorted(n for n in names if names.count(n) > 1)}")
if sts:
    if sts["metadata"]["name"] != "platform-etcd-steward" or sts["spec"]["serviceName"] != "platform-etcd-steward":
        problem(f"subchart: the StatefulSet is {sts['metadata']['name']} (service {sts['spec']['serviceName']}), want platform-etcd-steward")
    e = env_of(cs["etcd"])
    if not any(v.get("value") == "platform-etcd-steward" for v in e.values()):
        problem("subchart: no variable of the etcd container names the headless service platform-etcd-steward (the pods' DNS names)")
    images = {c["image"] for c in pod["containers"]}
    if images != {"registry.example.com/etcd-steward:0.1.0"}:
        problem(f"subchart: global.imageRegistry not before the image: {images}")
    if pod.get("imagePullSecrets") != [{"name": "platform-pull"}, {"name": "shared-pull"}]:
        problem(f"subchart: global.imagePullSecrets not honoured: {pod.get('imagePullSecrets')}")
    if sts["spec"]["volumeClaimTemplates"][0]["spec"].get("storageClassName") != "fast-ssd":
        problem("subchart: global.storageClass not honoured")

# ---- the extension points land where they should -----------------------------------------
ext = template("etcd", "--set", "image.registry=reg.local:5000", "--set", "image.digest=sha256:" + "b" * 64,
               "--set", "storage.className=local", "--set", "global.storageClass=ignored",
               "--set-json", 'sidecars=[{"name":"shipper","image":"shipper:1"}]',
               "--set-json", 'initContainers=[{"name":"prep","image":"prep:1"}]',
               "--set-json", 'topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"kubernetes.io/hostname","whenUnsatisfiable":"DoNotSchedule","labelSelector":{"matchLabels":{"app.kubernetes.io/instance":"etcd"}}}]',
               "--set-string", "service.annotations.a=1", "--set-string", "headlessService.annotations.b=2",
               "--set-string", "storage.annotations.c=3", "--set", "terminationGracePeriodSeconds=120",
               "--set", "runtimeClassName=gvisor", "--set-json", 'hostAliases=[{"ip":"10.0.0.1","hostnames":["x"]}]',
               "--set-string", "podAnnotations.prometheus\\.io/port=9999")
sts, pod, cs = sts_parts(ext, "extension points")
if sts:
    want = "reg.local:5000/etcd-steward:0.1.0@sha256:" + "b" * 64
    if {c["image"] for c in pod["containers"] if c["name"] in ("etcd", "sidecar")} != {want}:
        problem(f"extension points: image.registry and image.digest do not make {want}")
    if [c["name"] for c in pod["containers"]] != ["etcd", "sidecar", "shipper"] or [c["name"] for c in pod.get("initContainers", [])] != ["prep"]:
        problem("extension points: sidecars and initContainers not after the chart's own")
    if [t["topologyKey"] for t in pod.get("topologySpreadConstraints", [])] != ["kubernetes.io/hostname"]:
        problem("extension points: topologySpreadConstraints as a list not used instead of topologySpread")
    if pod.get("terminationGracePeriodSeconds") != 120 or pod.get("runtimeClassName") != "gvisor" or pod.get("hostAliases", [{}])[0].get("ip") != "10.0.0.1":
        problem("extension points: terminationGracePeriodSeconds, runtimeClassName or hostAliases not on the pod")
    ann = sts["spec"]["template"]["metadata"].get("annotations", {})
    if ann.get("prometheus.io/port") != "9999" or ann.get("prometheus.io/scrape") != "true":
        problem(f"extension points: podAnnotations do not override the prometheus.io ones, once each: {ann}")
    claim = sts["spec"]["volumeClaimTemplates"][0]
    if claim["metadata"].get("annotations") != {"c": "3"} or claim["spec"].get("storageClassName") != "local":
        problem("extension points: storage.annotations or storage.className (over global.storageClass) not on the claim")
    svcs = {d["metadata"]["name"]: d for d in ext if d["kind"] == "Service"}
    if svcs.get("etcd-client", {}).get("metadata", {}).get("annotations") != {"a": "1"} or svcs.get("etcd", {}).get("metadata", {}).get("annotations") != {"b": "2"}:
        problem("extension points: service.annotations or headlessService.annotations not on their Service")
docs = template("etcd", "--set", "metrics.scrapeAnnotations=false")
sts, pod, cs = sts_parts(docs, "scrapeAnnotations")
if sts and any(k.startswith("prometheus.io/") for k in sts["spec"]["template"]["metadata"].get("annotations", {})):
    problem("metrics.scrapeAnnotations=false still renders prometheus.io annotations")

# ---- 3. the NetworkPolicy admits exactly the ports the pods open ----------------------------
help_text = subprocess.run([binary, "sidecar", "--help"], capture_output=True, text=True).stdout


def default_of(option):
    m = re.search(rf"--{option} <[A-Z_]+>\n.*?\[default: ([^\]]+)\]", help_text, re.S)
    if not m:
        problem(f"netpol: `etcd-steward sidecar --help` gives no default for --{option}")
        return None
    return int(m.group(1))


def agent_port(c, option, env):
    for a in c.get("args", []):
        if a.startswith(f"--{option}="):
            return int(a.split("=", 1)[1])
    e = env_of(c).get(env)
    return int(e["value"]) if e else default_of(option)


def check_netpol(docs, where):
    sts, pod, cs = sts_parts(docs, where)
    np = one(docs, "NetworkPolicy", where)
    if not sts or not np:
        return
    etcd, side = cs["etcd"], cs["sidecar"]
    metrics = [a for a in etcd.get("args", []) if a.startswith("--listen-metrics-urls=")]
    serving = {
        "client": agent_port(etcd, "client-port", "ETCD_STEWARD_CLIENT_PORT"),
        "peer": agent_port(etcd, "peer-port", "ETCD_STEWARD_PEER_PORT"),
        "metrics": int(metrics[0].rsplit(":", 1)[1]) if metrics else None,
        "http": agent_port(side, "http-port", "ETCD_STEWARD_HTTP_PORT"),
        "peer-report": agent_port(side, "peer-report-port", "ETCD_STEWARD_PEER_REPORT_PORT"),
    }
    declared = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
    if declared != serving:
        problem(f"netpol {where}: the containers declare {declared}, the agent and etcd serve {serving}")
    spec = np["spec"]
    if spec["podSelector"] != sts["spec"]["selector"] or spec.get("policyTypes") != ["Ingress"]:
        problem(f"netpol {where}: podSelector {spec['podSelector']} / policyTypes {spec.get('policyTypes')}: want the StatefulSet's selector, Ingress")
    own = [{"podSelector": sts["spec"]["selector"]}]
    by_port = {}
    for rule in spec.get("ingress", []):
        for p in rule.get("ports", []):
            port = p["port"] if isinstance(p["port"], int) else declared.get(p["port"])
            if p.get("protocol", "TCP") != "TCP" or "endPort" in p:
                problem(f"netpol {where}: port {p} is not one TCP port")
            by_port.setdefault(port, []).append(rule.get("from"))
    if set(by_port) != set(serving.values()):
        problem(f"netpol {where}: the policy admits ports {sorted(by_port)}, the pods open {sorted(serving.values())}")
    for name in ("peer", "peer-report"):
        if by_port.get(serving[name]) != [own]:
            problem(f"netpol {where}: {name} port {serving[name]} admitted from {by_port.get(serving[name])}, want this release's pods only")
    for name in ("http", "metrics"):
        if None not in by_port.get(serving[name], []):
            problem(f"netpol {where}: {name} port {serving[name]} is not open to the kubelet and Prometheus")
    for port, froms in by_port.items():
        if None in froms and port not in (serving["http"], serving["metrics"]):
            problem(f"netpol {where}: port {port} is open to anyone; only the probe/metrics ports may be")
    client_from = by_port.get(serving["client"], [])
    if own not in client_from or len(client_from) != 2:
        problem(f"netpol {where}: the client port is admitted from {client_from}: want this release's pods and the clients")
    probes = {(c[k].get("httpGet") or c[k].get("tcpSocket"))["port"] for c in pod["containers"]
              for k in ("livenessProbe", "readinessProbe", "startupProbe") if k in c}
    if {declared.get(p, p) for p in probes} != {serving["http"], serving["metrics"]}:
        problem(f"netpol {where}: the probes ask ports {probes}, not the sidecar's http port and etcd's metrics port")


check_netpol(template("etcd"), "defaults")
check_netpol(template("etcd", "--set", "tls.enabled=true"), "tls")
check_netpol(template("etcd", "-f", f"{chart}/ci/platform-values.yaml"), "platform")
check_netpol(template("etcd", "--set", "etcd.metricsPort=9379"), "etcd.metricsPort=9379")
check_netpol(kustomize("manifests/base"), "manifests/base")
check_netpol(kustomize("manifests/overlays/tls"), "manifests/overlays/tls")
if any(d["kind"] == "NetworkPolicy" for d in template("etcd", "--set", "networkPolicy.enabled=false")):
    problem("netpol: networkPolicy.enabled=false still renders one")
docs = template("etcd", "-f", f"{chart}/ci/platform-values.yaml")
np = one(docs, "NetworkPolicy", "platform")
if np:
    want = [{"podSelector": {"matchLabels": {"etcd-client": "true"}}, "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}},
            {"ipBlock": {"cidr": "10.0.0.0/24"}}]
    if np["spec"]["ingress"][0]["from"] != want:
        problem(f"netpol platform: the clients are {np['spec']['ingress'][0]['from']}, want {want}")

# The client rule is closed by default: the pods labelled etcd-steward.io/client=<name>, never
# every pod; `{}` only when asked for.
for where, args, want in [("defaults", [], {"matchLabels": {"etcd-steward.io/client": "etcd"}}),
                          ("clientSelector {}", ["--set-json", "networkPolicy.clientSelector={}"], {})]:
    nps = [d for d in template("etcd", *args) if d["kind"] == "NetworkPolicy"]
    got = nps[0]["spec"]["ingress"][0]["from"][0].get("podSelector") if nps else None
    if got != want:
        problem(f"netpol {where}: the client rule selects {got}, want {want}")
base_np = [d for d in kustomize("manifests/base") if d["kind"] == "NetworkPolicy"]
if base_np and base_np[0]["spec"]["ingress"][0]["from"][0].get("podSelector") != {"matchLabels": {"etcd-steward.io/client": "etcd"}}:
    problem("netpol manifests/base: the client rule is not the pods labelled etcd-steward.io/client=etcd")

# ---- 4. the control token -------------------------------------------------------------------
TOKEN_DIR, TOKEN_FILE = "/var/run/etcd-steward/control", "/var/run/etcd-steward/control/token"


def check_token(docs, where, secret, key):
    sts, pod, cs = sts_parts(docs, where)
    if not sts:
        return
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    vol = vols.get("control-token", {}).get("secret", {})
    if vol.get("secretName") != secret or vol.get("items") != [{"key": key, "path": "token"}] or vol.get("defaultMode", 0o644) & 0o007:
        problem(f"control token {where}: volume {vol}, want Secret {secret} item {key} as `token`, unreadable by others")
    for name in ("etcd", "sidecar"):
        c = cs[name]
        if env_of(c).get("ETCD_STEWARD_CONTROL_TOKEN_FILE", {}).get("value") != TOKEN_FILE:
            problem(f"control token {where}: container {name} lacks ETCD_STEWARD_CONTROL_TOKEN_FILE={TOKEN_FILE}")
        mounts = [m for m in c.get("volumeMounts", []) if m["name"] == "control-token"]
        if mounts != [{"name": "control-token", "mountPath": TOKEN_DIR, "readOnly": True}]:
            problem(f"control token {where}: container {name} mounts {mounts}, want it read-only at {TOKEN_DIR} (no subPath: a rotated Secret must reach the file)")


docs = template("etcd")
check_token(docs, "defaults", "etcd-control-token", "token")
secrets = [d for d in docs if d["kind"] == "Secret"]
if len(secrets) != 1 or secrets[0]["metadata"]["name"] != "etcd-control-token":
    problem(f"control token: the defaults render Secrets {[s['metadata']['name'] for s in secrets]}, want etcd-control-token")
else:
    token = base64.b64decode(secrets[0]["data"]["token"]).decode()
    if not re.fullmatch(r"[A-Za-z0-9]{48}", token) or set(secrets[0]["data"]) != {"token"}:
        problem("control token: the Secret's `token` is not 48 random letters and digits")
    again = [d for d in template("etcd") if d["kind"] == "Secret"][0]["data"]["token"]
    if again == secrets[0]["data"]["token"]:
        problem("control token: two renders made the same token (not random)")
    source = open(f"{chart}/templates/secret-control-token.yaml").read()
    if not re.search(r'lookup "v1" "Secret" \.Release\.Namespace \$secret', source):
        problem("control token: the Secret's template does not look up the token the cluster holds (an upgrade would change it)")
docs = template("etcd", "--set", "controlToken.existingSecret=platform-token", "--set", "controlToken.secretKey=etcd")
check_token(docs, "existingSecret", "platform-token", "etcd")
if any(d["kind"] == "Secret" for d in docs):
    problem("control token: with existingSecret the chart still makes a Secret")
docs = template("etcd", "--set", "controlToken.enabled=false")
sts, pod, cs = sts_parts(docs, "controlToken.enabled=false")
if sts and (any(d["kind"] == "Secret" for d in docs) or "control-token" in json.dumps(pod)
            or any("ETCD_STEWARD_CONTROL_TOKEN_FILE" in env_of(c) for c in cs.values())):
    problem("control token: controlToken.enabled=false still sets up a token")

# ---- 5. backups: sized from the quota, as the overlays; workload identity, gs://, az:// ------
UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9}


def quantity(q):
    m = re.fullmatch(r"([0-9]+)([A-Za-z]*)", str(q))
    return int(m.group(1)) * UNITS[m.group(2)]


def sizing(docs, where):
    sts, pod, cs = sts_parts(docs, where)
    if not sts:
        return None
    quota = [int(a.split("=")[1]) for a in cs["etcd"]["args"] if a.startswith("--quota-backend-bytes=")][0]
    scratch_dir = env_of(cs["sidecar"])["ETCD_STEWARD_BACKUP_SCRATCH_DIR"]["value"]
    mount = [m["name"] for m in cs["sidecar"]["volumeMounts"] if m["mountPath"] == scratch_dir]
    vol = {v["name"]: v for v in pod["volumes"]}[mount[0]]["emptyDir"]
    r = cs["sidecar"]["resources"]
    return (quota, quantity(vol["sizeLimit"]), quantity(r["limits"]["memory"]), quantity(r["requests"]["memory"]),
            quantity(r["requests"].get("ephemeral-storage", "0")))


def want_sizing(quota):
    """Scratch, memory limit, memory request, ephemeral-storage request: the drill's needs."""
    mib = -(-quota // (1 << 20))
    scratch, memory = mib * 5 // 2 << 20, (mib + 512) << 20
    return scratch, memory, memory, scratch


for where, docs in [("chart s3", template("etcd", "--set", "backups.enabled=true", "--set", "backups.url=s3://b/p")),
                    ("chart file", template("etcd", "-f", f"{chart}/ci/backups-file-values.yaml")),
                    ("chart 8GiB", template("etcd", "-f", f"{chart}/ci/backups-workload-identity-values.yaml")),
                    ("manifests/overlays/backup-s3", kustomize("manifests/overlays/backup-s3")),
                    ("manifests/overlays/backup-file", kustomize("manifests/overlays/backup-file")),
                    ("manifests/overlays/backup-encrypted", kustomize("manifests/overlays/backup-encrypted"))]:
    got = sizing(docs, where)
    if got and got[1:] != want_sizing(got[0]):
        problem(f"backups {where}: quota {got[0]}: scratch, sidecar memory limit and request, ephemeral-storage request {got[1:]} bytes, want 2.5 x quota, quota + 512Mi twice, 2.5 x quota = {want_sizing(got[0])}")
docs = template("etcd", "--set", "backups.enabled=true", "--set", "backups.url=s3://b/p",
                "--set", "backups.scratch.sizeLimit=30Gi", "--set", "backups.sidecarMemoryLimit=6Gi")
got = sizing(docs, "explicit sizes")
if got and got[1:] != (30 << 30, 6 << 30, 6 << 30, 30 << 30):
    problem(f"backups: backups.scratch.sizeLimit and sidecarMemoryLimit are not used as given: {got}")
# A user's sidecar resources are kept, never replaced (above the drill's need).
docs = template("etcd", "--set", "backups.enabled=true", "--set", "backups.url=s3://b/p",
                "--set", "sidecar.resources.requests.memory=3Gi", "--set", "sidecar.resources.limits.memory=4Gi",
                "--set", "sidecar.resources.requests.ephemeral-storage=8Gi")
got = sizing(docs, "a user's resources")
if got and got[2:] != (4 << 30, 3 << 30, 8 << 30):
    problem(f"backups: the sidecar's resources as given were not kept: {got}")
for s, ann, url in [("backups-workload-identity", "eks.amazonaws.com/role-arn", "s3://"), ("backups-gcs", "iam.gke.io/gcp-service-account", "gs://")]:
    docs = template("etcd", "-f", f"{chart}/ci/{s}-values.yaml")
    sts, pod, cs = sts_parts(docs, s)
    sa = one(docs, "ServiceAccount", s)
    if not sts or not sa:
        continue
    if ann not in sa["metadata"].get("annotations", {}) or pod.get("serviceAccountName") != sa["metadata"]["name"]:
        problem(f"{s}: the pods do not run as a ServiceAccount annotated {ann}")
    for name in ("etcd", "sidecar"):
        e = env_of(cs[name])
        if not e.get("ETCD_STEWARD_BACKUP_URL", {}).get("value", "").startswith(url):
            problem(f"{s}: container {name} has no {url} backup URL")
        if any(n.startswith(("AWS_", "GOOGLE_", "AZURE_")) for n in e) or "envFrom" in cs[name]:
            problem(f"{s}: container {name} reads static credentials")
docs = template("etcd", "-f", f"{chart}/ci/backups-azure-values.yaml")
sts, pod, cs = sts_parts(docs, "backups-azure")
for name in ("etcd", "sidecar") if sts else ():
    if cs[name].get("envFrom") != [{"secretRef": {"name": "etcd-backup-azure"}}]:
        problem(f"backups-azure: container {name} does not take its variables from backups.credentialsSecret")

# ---- 6. the platform values land where they should --------------------------------------------
docs = template("etcd", "-f", f"{chart}/ci/platform-values.yaml")
sts, pod, cs = sts_parts(docs, "platform")
if sts:
    values = yaml.safe_load(open(f"{chart}/ci/platform-values.yaml"))
    if pod["affinity"] != values["affinity"]:
        problem("platform: affinity does not replace the chart's")
    psc = pod.get("securityContext", {})
    if {"runAsUser", "runAsGroup", "fsGroup"} & set(psc) or psc.get("runAsNonRoot") is not True:
        problem(f"platform: the OpenShift setting leaves {psc}, want no runAsUser/runAsGroup/fsGroup and runAsNonRoot")
    if sts["spec"]["updateStrategy"] != values["updateStrategy"]:
        problem("platform: updateStrategy not passed through")
    for k in ("nodeSelector", "tolerations", "priorityClassName"):
        if pod.get(k) != values[k]:
            problem(f"platform: {k} not passed through")
    meta = sts["spec"]["template"]["metadata"]
    if meta["labels"].get("team") != "platform" or meta["annotations"].get("example.com/owner") != "platform":
        problem("platform: podLabels or podAnnotations missing on the pods")
    if {v["name"]: v for v in pod["volumes"]}.get("ca-bundle") != values["extraVolumes"][0]:
        problem("platform: extraVolumes missing")
    agent_args = values["agent"]["extraArgs"]
    etcd_args = cs["etcd"]["args"]
    if etcd_args[:etcd_args.index("--")] != agent_args:
        problem(f"platform: init's options {etcd_args[:etcd_args.index('--')]}, want agent.extraArgs before `--`")
    if cs["sidecar"].get("args") != agent_args + values["sidecar"]["extraArgs"]:
        problem(f"platform: the sidecar's options {cs['sidecar'].get('args')}, want agent.extraArgs then sidecar.extraArgs")
    init_help = subprocess.run([binary, "init", "--help"], capture_output=True, text=True).stdout
    for role, text, args in [("init", init_help, agent_args), ("sidecar", help_text, agent_args + values["sidecar"]["extraArgs"])]:
        for a in args:
            if not re.search(rf"^\s+{re.escape(a.split('=')[0])}[ =<]", text, re.M):
                problem(f"platform: `etcd-steward {role}` has no option {a.split('=')[0]}")
    for name, extra in [("etcd", "GOMAXPROCS"), ("sidecar", "TZ"), ("etcd", "TZ")]:
        if extra not in env_of(cs[name]):
            problem(f"platform: container {name} lacks {extra} (extraEnv)")
    for name in ("etcd", "sidecar"):
        c = cs[name]
        if not any(m["name"] == "ca-bundle" for m in c["volumeMounts"]):
            problem(f"platform: container {name} lacks extraVolumeMounts")
        if c.get("startupProbe", {}).get("failureThreshold") != 60 or c["livenessProbe"].get("periodSeconds") != 20 \
                or c["livenessProbe"].get("failureThreshold") != 6:
            problem(f"platform: container {name}'s probes do not follow probes.*")
docs = template("etcd")
sts, pod, cs = sts_parts(docs, "defaults")
if sts:
    aff = pod["affinity"]["podAntiAffinity"].get("requiredDuringSchedulingIgnoredDuringExecution", [])
    if [t["topologyKey"] for t in aff] != ["kubernetes.io/hostname"]:
        problem("defaults: anti-affinity across nodes is not required")
    spread = pod.get("topologySpreadConstraints", [])
    if [(t["topologyKey"], t["whenUnsatisfiable"]) for t in spread] != [("topology.kubernetes.io/zone", "ScheduleAnyway")]:
        problem("defaults: no zone spread that still schedules in a single zone (ScheduleAnyway)")

# ---- 10. the etcd container lives by etcd: its startup and liveness probes ask etcd ------------
# On etcd's metrics port, never the sidecar's: /livez where the release has it (3.5.11+, 3.4.29+,
# 3.6+; it needs no quorum), else a TCP connection (older /health fails without a leader).
# harness::kubelet::EtcdProbe runs the same probe against real etcd (tests/cluster.rs).
def etcd_probes(where, *args):
    docs = template("etcd", *args)
    sts, pod, cs = sts_parts(docs, where)
    if not sts:
        return None
    etcd, sidecar = cs["etcd"], cs["sidecar"]
    ports = {p["name"]: p["containerPort"] for p in etcd["ports"]}
    kinds = set()
    for probe in ("startupProbe", "livenessProbe"):
        got = etcd.get(probe)
        if got is None:
            problem(f"{where}: the etcd container has no {probe}")
            continue
        action = got.get("httpGet") or got.get("tcpSocket") or {}
        if action.get("port") != "metrics" or "metrics" not in ports:
            problem(f"{where}: the etcd container's {probe} asks port {action.get('port')!r}, not etcd's metrics port")
        kinds.add("livez" if got.get("httpGet", {}).get("path") == "/livez" else "tcp" if "tcpSocket" in got else repr(action))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        if sidecar.get(probe, {}).get("httpGet", {}).get("port") != "http":
            problem(f"{where}: the sidecar's {probe} does not ask the sidecar")
    if etcd.get("startupProbe", {}).get("failureThreshold", 0) * etcd.get("startupProbe", {}).get("periodSeconds", 10) < 1800:
        problem(f"{where}: the etcd container's startup window is under 30 minutes: init's waits would be cut short")
    return kinds


for where, args, want in [
        ("defaults (the image's etcd 3.5.30)", [], {"livez"}),
        ("etcd 3.5.25", ["--set", "etcd.image=gcr.io/etcd-development/etcd:v3.5.25"], {"livez"}),
        ("etcd 3.5.1", ["--set", "etcd.image=gcr.io/etcd-development/etcd:v3.5.1"], {"tcp"}),
        ("etcd 3.5.10", ["--set", "etcd.image=registry:5000/etcd:3.5.10"], {"tcp"}),
        ("etcd 3.4.23", ["--set", "etcd.image=gcr.io/etcd-development/etcd:v3.4.23"], {"tcp"}),
        ("etcd 3.4.29", ["--set", "etcd.image=gcr.io/etcd-development/etcd:v3.4.29"], {"livez"}),
        ("etcd 3.6.5", ["--set", "etcd.image=gcr.io/etcd-development/etcd:v3.6.5"], {"livez"}),
        ("a digest and etcd.version", ["--set", "etcd.image=registry/etcd@sha256:" + "a" * 64, "--set", "etcd.version=3.5.1"], {"tcp"}),
        ("a tag and its digest", ["--set", "etcd.image=registry:5000/etcd:v3.6.5@sha256:" + "a" * 64], {"livez"})]:
    got = etcd_probes(where, *args)
    if got is not None and got != want:
        problem(f"{where}: the etcd container's probes are {sorted(got)}, want {sorted(want)}")
r = subprocess.run([helm, "template", "etcd", chart, "--set", "etcd.image=registry/etcd@sha256:" + "a" * 64],
                   capture_output=True, text=True)
if r.returncode == 0 or "etcd.version" not in r.stderr:
    problem(f"a digest without etcd.version must fail the render naming etcd.version: {r.stderr.strip()!r}")

# ---- 7. NOTES.txt and the docs reach etcd where it listens --------------------------------------
def notes(*args):
    r = subprocess.run([helm, "install", "etcd", chart, "--namespace", "prod", "--dry-run=client", *args],
                       capture_output=True, text=True)
    if r.returncode:
        problem(f"NOTES: helm install --dry-run=client {' '.join(args)} failed: {r.stderr.strip()}")
        return "", []
    text = r.stdout.split("\nNOTES:\n", 1)[1] if "\nNOTES:\n" in r.stdout else ""
    manifest = r.stdout.split("\nNOTES:\n", 1)[0].split("MANIFEST:\n", 1)[-1]
    return text, docs_of(manifest)


for where, args in [("defaults", []), ("tls", ["--set", "tls.enabled=true"]),
                    ("copy-in", ["--set", "etcd.image=gcr.io/etcd-development/etcd:v3.5.25"])]:
    text, docs = notes(*args)
    sts, pod, cs = sts_parts(docs, f"NOTES {where}")
    if not sts:
        continue
    e = env_of(cs["etcd"])
    if e.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "status.podIP":
        problem(f"NOTES {where}: etcd's listen address (POD_IP) is not the pod's IP; the check below assumes it")
    if re.search(r"127\.0\.0\.1|localhost", text):
        problem(f"NOTES {where}: names 127.0.0.1 or localhost, where etcd does not listen")
    lines = [l for l in text.splitlines() if "etcdctl" in l]
    if not lines:
        problem(f"NOTES {where}: no etcdctl command")
    tls = "ETCD_STEWARD_CLIENT_CERT_FILE" in e
    name, svc = sts["metadata"]["name"], sts["spec"]["serviceName"]
    want = f"{'https' if tls else 'http'}://{name}-0.{svc}.prod.svc.cluster.local:2379"
    for l in lines:
        m = re.search(r"--endpoints=(\S+)", l)
        if not m or m.group(1) != want:
            problem(f"NOTES {where}: {l.strip()!r} does not ask {want} (the pod's DNS name, where etcd listens)")
        flags = dict(re.findall(r"--(cacert|cert|key)=(\S+)", l))
        want_flags = {"cacert": e["ETCD_STEWARD_TRUSTED_CA_FILE"]["value"], "cert": e["ETCD_STEWARD_CLIENT_CERT_FILE"]["value"],
                      "key": e["ETCD_STEWARD_CLIENT_KEY_FILE"]["value"]} if tls else {}
        if flags != want_flags:
            problem(f"NOTES {where}: TLS flags {flags}, want {want_flags}")
    # The runbooks run `kubectl exec ... -c etcd -- etcd-steward ...`: the name must resolve on
    # the etcd container's PATH in every shape (the copy-in shape puts /steward first).
    steward = cs["etcd"]["command"][0]
    path = e.get("PATH", {}).get("value", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    if os.path.dirname(steward) not in path.split(":"):
        problem(f"NOTES {where}: the etcd container runs {steward}, whose directory is not on its PATH ({path}): `kubectl exec ... -c etcd -- etcd-steward` would fail")
    for l in (l for l in text.splitlines() if "etcd-steward status" in l):
        if l.split(" -- ", 1)[1].split()[0] != "etcd-steward":
            problem(f"NOTES {where}: {l.strip()!r} does not run etcd-steward by its name (on PATH in both shapes)")
doc_files = ["README.md"] + sorted(glob.glob("docs/**/*.md", recursive=True))
execs = 0
for f in doc_files:
    for l in open(f).read().splitlines():
        if l.lstrip().startswith("kubectl") and " exec " in l and "etcdctl" in l:
            execs += 1
            if "--endpoints=" not in l:
                problem(f"{f}: {l.strip()!r} runs etcdctl without --endpoints (it would ask 127.0.0.1:2379, where etcd does not listen)")
if not execs:
    problem(f"docs: no `kubectl … exec … etcdctl` command found in {doc_files}: is this check still looking at the docs?")

# ---- 8. RBAC: exactly the calls the code makes -------------------------------------------------
source = "".join(open(f).read() for f in sorted(glob.glob("src/kube_api/**/*.rs", recursive=True)))
KINDS = {"StatefulSet": ("apps", "statefulsets"), "Pod": ("", "pods"), "Event": ("events.k8s.io", "events")}
calls = set()
for kind, verb in re.findall(r"Api::<(\w+)>::\w+\([^)]*\)\s*\.(get|list|watch|create|delete|patch|replace)\(", source):
    calls.add(KINDS[kind] + (verb,))
if calls != {("apps", "statefulsets", "get"), ("", "pods", "list"), ("events.k8s.io", "events", "create"), ("events.k8s.io", "events", "patch")}:
    problem(f"rbac: src/kube_api/ calls {sorted(calls)}: review the Role and this check")
for where, docs in [("chart", template("etcd")), ("manifests/base", kustomize("manifests/base"))]:
    role = one(docs, "Role", where)
    if not role:
        continue
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    if granted != calls:
        problem(f"rbac {where}: the Role grants {sorted(granted)}, the code calls {sorted(calls)}")
    for rule in role["rules"]:
        if rule["resources"] == ["statefulsets"] and rule.get("resourceNames") != [role["metadata"]["name"]]:
            problem(f"rbac {where}: the StatefulSet rule is not limited to this StatefulSet")

# ---- 9. alerts point at the runbook's table, which has a row (and an anchor) for each -----------
RUNBOOK = "docs/operations/alerts.md"
rules = [r for g in yaml.safe_load(open(f"{chart}/files/alerts.yaml"))["groups"] for r in g["rules"]]
runbook = open(RUNBOOK).read()
triage = open("docs/operations/triage.md").read()
section = runbook.split("\n## Alerts\n", 1)[1].split("\n## ", 1)[0] if "\n## Alerts\n" in runbook else ""
for r in rules:
    if not r["annotations"]["description"].endswith(f"Runbook: {RUNBOOK}#{r['alert']}"):
        problem(f"alerts: {r['alert']}'s description does not end with its runbook, Runbook: {RUNBOOK}#{r['alert']}")
    if f'| <a name="{r["alert"]}"></a>`{r["alert"]}` |' not in section:
        problem(f"alerts: {RUNBOOK}'s Alerts section has no row for {r['alert']} carrying its anchor (<a name=\"{r['alert']}\"></a>)")
    if 'job="etcd"' not in r["expr"]:
        problem(f"alerts: {r['alert']} is not scoped to the job (job=\"etcd\", which the chart replaces)")
    if r["annotations"].get("runbook_url") != f"docs/operations/triage.md#{r['alert']}":
        problem(f"alerts: {r['alert']}'s runbook_url is {r['annotations'].get('runbook_url')!r}, want docs/operations/triage.md#{r['alert']}")
    if f'<a name="{r["alert"]}"></a>' not in triage:
        problem(f"alerts: docs/operations/triage.md has no anchor for {r['alert']} (<a name=\"{r['alert']}\"></a>), where its runbook_url points")
    for clause in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", r["expr"]):
        if "namespace" not in [c.strip() for c in clause.split(",")]:
            problem(f"alerts: {r['alert']} aggregates or matches by ({clause}), dropping namespace: two clusters in two namespaces would be one alert")

# The alerts read the job the chart's monitors give: the ServiceMonitor's is the headless
# service's name, the PodMonitor sets it to the same; metrics.alertSelector replaces it.
docs = template("etcd", "--set", "metrics.podMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true", ns="prod")
sts, pod, cs = sts_parts(docs, "monitors")
pm, pr = one(docs, "PodMonitor", "monitors"), one(docs, "PrometheusRule", "monitors")
if sts and pm and pr:
    job = sts["spec"]["serviceName"]
    names = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
    if pm["apiVersion"] != "monitoring.coreos.com/v1" or sorted(e["port"] for e in pm["spec"]["podMetricsEndpoints"]) != ["http", "metrics"] \
            or not {"http", "metrics"} <= names:
        problem("monitors: the PodMonitor must scrape the pods' ports http (sidecar) and metrics (etcd)")
    for e in pm["spec"]["podMetricsEndpoints"]:
        if e.get("relabelings") != [{"targetLabel": "job", "replacement": job}]:
            problem(f"monitors: the PodMonitor's {e['port']} endpoint does not set job={job} (what the alerts select)")
    exprs = [r["expr"] for g in pr["spec"]["groups"] for r in g["rules"]]
    if not all(f'job="{job}", namespace="prod"' in e for e in exprs):
        problem(f"monitors: the PrometheusRule's alerts do not all select job=\"{job}\", namespace=\"prod\"")
docs = template("etcd", "--set", "metrics.prometheusRule.enabled=true", "--set", 'metrics.alertSelector=job="etcd-main"')
pr = one(docs, "PrometheusRule", "alertSelector")
if pr and not all('job="etcd-main"' in r["expr"] and "namespace=" not in r["expr"] for g in pr["spec"]["groups"] for r in g["rules"]):
    problem("monitors: metrics.alertSelector does not replace the alerts' selector")
base = "https://git.example.com/etcd-steward/raw/v0.1.0/"
pr = one(template("etcd", "--set", "metrics.prometheusRule.enabled=true", "--set", f"metrics.runbookBaseUrl={base}"), "PrometheusRule", "runbookBaseUrl")
if pr and not all(r["annotations"]["runbook_url"] == f"{base}docs/operations/triage.md#{r['alert']}" for g in pr["spec"]["groups"] for r in g["rules"]):
    problem("monitors: metrics.runbookBaseUrl is not put before every runbook_url")

for p in problems:
    print(p, file=sys.stderr)
sys.exit(1 if problems else 0)
