"""Transport: the Kubernetes API server, with the caller's own credentials.

Session objects are custom resources of sandbox.warmpool.dev; runs go to the
data plane, data.warmpool.dev, which kube-apiserver's aggregation layer
serves: whatever credential the kubeconfig holds (token, client certificate,
exec plugin) works, and RBAC on the Session decides.
"""

import json
import os

import kubernetes
from kubernetes.client.exceptions import ApiException

from . import errors

GROUP = "sandbox.warmpool.dev"
VERSION = "v1alpha1"
DATA_GROUP = "data.warmpool.dev"
_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def load(kubeconfig=None, context=None):
    """Return (ApiClient, default namespace) the way Kubernetes clients find
    their cluster: an explicit kubeconfig, else in-cluster credentials in a
    pod, else $KUBECONFIG or ~/.kube/config."""
    cfg = kubernetes.client.Configuration()
    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(_SA_NAMESPACE):
        kubernetes.config.load_incluster_config(client_configuration=cfg)
        with open(_SA_NAMESPACE) as f:
            return kubernetes.client.ApiClient(cfg), f.read().strip()
    kubernetes.config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    namespace = "default"
    try:
        contexts, current = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
        if context is not None:
            current = next(c for c in contexts if c["name"] == context)
        namespace = current.get("context", {}).get("namespace") or "default"
    except Exception:  # a kubeconfig without contexts: the default namespace
        pass
    return kubernetes.client.ApiClient(cfg), namespace


def api_error(e):
    """Turn an ApiException into the package's error for its status."""
    reason, message = e.reason or "", ""
    try:
        status = json.loads(e.body)
        reason, message = status.get("reason") or reason, status.get("message") or ""
    except (TypeError, ValueError):
        message = (e.body.decode() if isinstance(e.body, bytes) else str(e.body or "")).strip()
    if e.status == 403 and "warmpool.dev" in message:
        message += (" (warmpool's ClusterRoles: warmpool-session-editor-role to create Sessions and run code in them,"
                    " warmpool-execution-editor-role for Executions; bind one in the namespace)")
    cls = {403: errors.ForbiddenError, 404: errors.NotFoundError}.get(e.status, errors.APIError)
    return cls(e.status, reason, message)


def request(api, method, path, query=None, body=None, content_type="application/json",
            accept="application/json", timeout=None):
    """Send a request to the API server and return its urllib3 response,
    unread (so that a stream can be read as it comes)."""
    headers = {"Accept": accept}
    if body is not None:
        headers["Content-Type"] = content_type
    try:
        return api.call_api(path, method, query_params=list((query or {}).items()), header_params=headers,
                            body=body, auth_settings=["BearerToken"], _preload_content=False,
                            _return_http_data_only=True, _request_timeout=timeout)
    except ApiException as e:
        raise api_error(e) from None


def request_json(api, method, path, query=None, body=None, timeout=None):
    resp = request(api, method, path, query=query, body=body, timeout=timeout)
    data = resp.data
    return json.loads(data) if data else None


def pool_ref(pool):
    """The poolRef of ``pool``: "name" (the object's own namespace) or
    "namespace/name" (a shared pool of the platform's namespace)."""
    ns, sep, name = pool.partition("/")
    return {"namespace": ns, "name": name} if sep else {"name": pool}


def whoami(api):
    """The user kube-apiserver authenticates ``api`` as (a SelfSubjectReview,
    which every authenticated user may make; ``kubectl auth whoami``), asked
    once per ApiClient."""
    name = getattr(api, "_warmpool_user", None)
    if name:
        return name
    review = request_json(api, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                          body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    name = ((review or {}).get("status") or {}).get("userInfo", {}).get("username") or ""
    if not name:
        raise errors.WarmpoolError("kube-apiserver names no user for these credentials")
    api._warmpool_user = name
    return name


def owner(api):
    """whoami, or None when kube-apiserver does not say (the creator is then
    not recorded)."""
    try:
        return whoami(api)
    except errors.WarmpoolError:
        return None


def data_plane_path(namespace, name, sub):
    return f"/apis/{DATA_GROUP}/{VERSION}/namespaces/{namespace}/sessions/{name}/{sub}"


def has_data_plane(api):
    """Whether the cluster serves the data plane (data.warmpool.dev), asked
    once per ApiClient."""
    known = getattr(api, "_warmpool_data_plane", None)
    if known is not None:
        return known
    try:
        resp = request(api, "GET", f"/apis/{DATA_GROUP}/{VERSION}")
        _ = resp.data  # read to its end: a connection given back unread breaks the next request on it
        resp.release_conn()
        known = True
    except errors.APIError:
        known = False
    api._warmpool_data_plane = known
    return known
