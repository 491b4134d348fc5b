"""The declarative path: one Execution object, created, waited for, read.
Slower than a Sandbox (each run is API writes and an object in etcd), but
every run is a record ``kubectl get executions`` shows and RBAC audits."""

import json

import kubernetes
from kubernetes.client.exceptions import ApiException

from . import _api, errors
from .execution import Execution, ExecutionError

_DONE = {"Succeeded": "succeeded", "Failed": "failed", "TimedOut": "timed_out", "Cancelled": "interrupted"}


def run(code, pool, namespace=None, *, timeout=None, context=None, envs=None, session=None, name="run-",
        request_timeout=300, kubeconfig=None, kube_context=None, api_client=None):
    """Create an Execution of ``code`` in ``pool``, wait for it to finish and
    return it as an Execution (``id`` is the object's name). ``timeout`` is
    the run's, in seconds; ``session`` runs it in that Session (created on
    first use); the object stays for its TTL."""
    api, default_ns = (api_client, "default") if api_client is not None else _api.load(kubeconfig, kube_context)
    namespace = namespace or default_ns
    spec = {"poolRef": {"name": pool}, "code": code}
    if timeout is not None:
        spec["timeout"] = f"{timeout}s"
    if context is not None:
        if isinstance(context, str):
            spec["context"] = context
        else:
            spec["context"], spec["contextFormat"] = json.dumps(context), "json"
    if envs:
        spec["env"] = [{"name": k, "value": str(v)} for k, v in envs.items()]
    if session:
        spec["session"] = session
    me = _api.owner(api)  # who created it, and what a Session bound to its owner checks
    if me:
        spec["owner"] = me
    meta = {"generateName": name} if name.endswith("-") else {"name": name}
    objects = kubernetes.client.CustomObjectsApi(api)
    try:
        obj = objects.create_namespaced_custom_object(_api.GROUP, _api.VERSION, namespace, "executions",
                                                      {"apiVersion": f"{_api.GROUP}/{_api.VERSION}", "kind": "Execution",
                                                       "metadata": meta, "spec": spec})
    except ApiException as e:
        raise _api.api_error(e) from None
    obj_name = obj["metadata"]["name"]
    if (obj.get("status") or {}).get("phase") in _DONE:
        return _execution(obj)
    w = kubernetes.watch.Watch()
    try:
        for ev in w.stream(objects.list_namespaced_custom_object, _api.GROUP, _api.VERSION, namespace, "executions",
                           field_selector=f"metadata.name={obj_name}", resource_version=obj["metadata"]["resourceVersion"],
                           timeout_seconds=int(request_timeout)):
            if ev["type"] == "DELETED":
                raise errors.WarmpoolError(f"Execution {obj_name} was deleted before it finished")
            obj = ev["object"]
            if (obj.get("status") or {}).get("phase") in _DONE:
                return _execution(obj)
    except ApiException as e:
        raise _api.api_error(e) from None
    finally:
        w.stop()
    raise errors.TimeoutError(f"Execution {obj_name} did not finish within {request_timeout}s "
                              f"(kubectl get execution {obj_name} -n {namespace} says where it is)")


def _execution(obj):
    st = obj.get("status") or {}
    err = st.get("error")
    return Execution(
        id=obj["metadata"]["name"], status=_DONE[st["phase"]], stdout=st.get("stdout", ""), stderr=st.get("stderr", ""),
        text=st.get("result") or None, duration=float(st.get("durationMillis") or 0) / 1000,
        stdout_truncated=bool(st.get("stdoutTruncated")), stderr_truncated=bool(st.get("stderrTruncated")), raw=obj,
        error=ExecutionError(err.get("type", ""), err.get("message", ""), err.get("traceback", "")) if err else None,
    )
