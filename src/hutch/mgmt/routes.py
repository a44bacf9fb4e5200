"""The route table of the management API: one thin handler per (method, path), RabbitMQ's paths.

Owns: every `@route` of /api (except the definitions upload/download and /metrics, which http.py serves
with raw aiohttp handlers). A handler picks path parameters, query and body out of a `Call`, calls one
service function (users, topology, clients, messages, policies, health, system) and shapes the reply
with `listing` (sort, filter, paginate, columns). Each route also says what the OpenAPI description
(openapi.py) publishes about it: summary, tag, reply and body schemas, list or not, extra statuses.

Rules:
- Fixed paths are registered before variable ones that could match them (aiohttp matches in order):
  /api/users/without-permissions before /api/users/{user}.
- List endpoints pass `listing=True` and go through `listing.list_reply`; object endpoints through
  `listing.one_reply` (which applies `columns`).
"""

from __future__ import annotations

from typing import Any

from . import clients, environment, formats, health, listing, messages, policies, system, topology, users
from .calls import NO_CONTENT, Call, Reply, Status, created, route
from .errors import bad_request

BINDING_SORT = ("vhost", "source", "destination_type", "destination", "routing_key")
CONSUMER_SORT = ("queue.vhost", "queue.name", "consumer_tag")
POLICY_SORT = ("priority", "vhost", "name")  # RabbitMQ sorts policy lists by priority
PERMISSION_SORT = ("vhost", "user")
TOPIC_PERMISSION_SORT = ("vhost", "user", "exchange")
NAME_SORT = ("name",)

SYSTEM, USERS, VHOSTS, PERMISSIONS, QUEUES, EXCHANGES, BINDINGS, CLIENTS, POLICIES, HEALTH = (
    "system", "users", "vhosts", "permissions", "queues", "exchanges", "bindings", "connections", "policies",
    "health")
CHANGED = (201, 204)  # PUT: created or replaced


def _list(c: Call, items: list[dict[str, Any]], sort: tuple[str, ...] = listing.DEFAULT_SORT) -> Any:
    return listing.list_reply(items, c.query, sort)


def _one(c: Call, obj: Any) -> Any:
    return listing.one_reply(obj, c.query)


# -- system -----------------------------------------------------------------------------------------


@route("GET", "/api/overview", "Node-wide totals, message rates and listeners", tag=SYSTEM, reply="Overview")
async def _overview(c: Call) -> Any:
    return _one(c, await system.overview(c.agent, c.node, c.principal, c.stats))


@route("GET", "/api/cluster-name", "The cluster name", tag=SYSTEM, reply="ClusterName")
def _cluster_name(c: Call) -> Any:
    return system.get_cluster_name(c.node)


@route("PUT", "/api/cluster-name", "Change the cluster name (administrators)", tag=SYSTEM, body="ClusterName",
       codes=(204, 400))
def _put_cluster_name(c: Call) -> Any:
    system.put_cluster_name(c.node, c.principal, c.body)
    return NO_CONTENT


@route("GET", "/api/environment", "The node's effective configuration, secrets left out (administrators; hutch: "
       "rabbitmqctl environment)", tag=SYSTEM, reply="Any")
def _environment(c: Call) -> Any:
    return environment.environment(c.node.config, c.principal)


@route("GET", "/api/whoami", "The authenticated user and its tags", tag=SYSTEM, reply="Whoami")
def _whoami(c: Call) -> Any:
    return users.whoami(c.principal)


@route("GET", "/api/extensions", "Management UI extensions (none)", tag=SYSTEM, reply="Any[]")
def _extensions(c: Call) -> Any:
    return []


@route("GET", "/api/nodes", "Nodes (monitoring)", tag=SYSTEM, reply="Node[]", listing=True)
async def _nodes(c: Call) -> Any:
    return _list(c, await system.list_cluster_nodes(c.agent, c.node, c.principal, c.now_ms, c.stats), NAME_SORT)


@route("GET", "/api/nodes/{node}", "One node (monitoring)", tag=SYSTEM, reply="Node", codes=(404,))
async def _node(c: Call) -> Any:
    return _one(c, await system.get_cluster_node(c.agent, c.node, c.principal, c.params["node"], c.now_ms,
                                                     c.stats))


@route("GET", "/api/aliveness-test/{vhost}", "Declare, publish to and get from the aliveness-test queue",
       tag=SYSTEM, reply="HealthStatus", codes=(404,))
def _aliveness(c: Call) -> Any:
    return system.aliveness_test(c.node, c.principal, c.params["vhost"])


# -- health checks ----------------------------------------------------------------------------------


def _health(result: tuple[int, dict[str, Any]]) -> Any:
    code, body = result
    return body if code == 200 else Reply(code, body)


@route("GET", "/api/health/checks/alarms", "Fails while a resource alarm is in effect", tag=HEALTH,
       reply="HealthStatus", codes=(503,))
def _health_alarms(c: Call) -> Any:
    return _health(health.alarms(c.node))


@route("GET", "/api/health/checks/local-alarms", "Fails while a resource alarm is in effect on this node",
       tag=HEALTH, reply="HealthStatus", codes=(503,))
def _health_local_alarms(c: Call) -> Any:
    return _health(health.alarms(c.node, local=True))


@route("GET", "/api/health/checks/virtual-hosts", "Fails when a virtual host is down", tag=HEALTH,
       reply="HealthStatus", codes=(503,))
def _health_vhosts(c: Call) -> Any:
    return _health(health.virtual_hosts(c.node))


@route("GET", "/api/health/checks/port-listener/{port}", "Fails when nothing listens on the port", tag=HEALTH,
       reply="HealthStatus", codes=(400, 503))
def _health_port(c: Call) -> Any:
    return _health(health.port_listener(c.node, c.params["port"]))


@route("GET", "/api/health/checks/certificate-expiration/{within}/{unit}",
       "Fails when a TLS listener's certificate (or CA certificate) expires within the period", tag=HEALTH,
       reply="HealthStatus", codes=(400, 503))
def _health_certificate_expiration(c: Call) -> Any:
    return _health(health.certificate_expiration(c.node, c.params["within"], c.params["unit"]))


@route("GET", "/api/health/checks/protocol-listener/{protocols}",
       "Fails when a protocol (amqp, http; comma-separated) has no listener", tag=HEALTH, reply="HealthStatus",
       codes=(503,))
def _health_protocol(c: Call) -> Any:
    return _health(health.protocol_listener(c.node, c.params["protocols"]))


@route("GET", "/api/health/checks/node-is-quorum-critical",
       "Fails when stopping this node would make a quorum queue lose its quorum", tag=HEALTH,
       reply="HealthStatus", codes=(503,))
def _health_quorum(c: Call) -> Any:
    return _health(health.node_is_quorum_critical(c.node))


@route("GET", "/api/health/checks/is-in-service", "Fails while the node does not accept clients", tag=HEALTH,
       reply="HealthStatus", codes=(503,))
def _health_in_service(c: Call) -> Any:
    return _health(health.is_in_service(c.node))


@route("GET", "/api/healthchecks/node", "Deprecated node health check: always ok, as RabbitMQ 4.x",
       tag=HEALTH, reply="HealthStatus")
def _healthchecks_node(c: Call) -> Any:
    return health.deprecated_node_check(c.node)


@route("GET", "/api/healthchecks/node/", "Deprecated node health check (with the trailing slash): always ok",
       tag=HEALTH, reply="HealthStatus")
def _healthchecks_node_slash(c: Call) -> Any:
    return health.deprecated_node_check(c.node)


@route("GET", "/api/healthchecks/node/{node}", "Deprecated health check of a cluster member: always ok, 404 "
       "for a node that is not a member", tag=HEALTH, reply="HealthStatus", codes=(404,))
def _healthchecks_named_node(c: Call) -> Any:
    return health.deprecated_node_check(c.node, c.params["node"])


# -- users ------------------------------------------------------------------------------------------


@route("GET", "/api/users", "Users (administrators)", tag=USERS, reply="User[]", listing=True)
def _users(c: Call) -> Any:
    return _list(c, users.list_users(c.node, c.principal), NAME_SORT)


@route("GET", "/api/users/without-permissions", "Users with no permission on any vhost", tag=USERS,
       reply="User[]", listing=True)
def _users_without_permissions(c: Call) -> Any:
    granted = {e["user"] for e in users.list_permissions(c.node, c.principal)}
    return _list(c, [u for u in users.list_users(c.node, c.principal) if u["name"] not in granted], NAME_SORT)


@route("POST", "/api/users/bulk-delete", "Delete several users: {\"users\": [names]}", tag=USERS,
       body="BulkDelete", codes=(204, 400))
async def _users_bulk_delete(c: Call) -> Any:
    names = c.body.get("users") if isinstance(c.body, dict) else None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad_request("[{key_missing,users}]" if not isinstance(c.body, dict) or "users" not in c.body
                          else "users must be a list of names")
    for name in names:
        if c.node.auth.get_user(name) is not None:
            await users.delete_user(c.agent, c.node, c.principal, name)
        else:
            users.require_admin(c.principal)
    return NO_CONTENT


@route("GET", "/api/users/{user}", "One user", tag=USERS, reply="User", codes=(404,))
def _user(c: Call) -> Any:
    return _one(c, users.get_user(c.node, c.principal, c.params["user"]))


@route("PUT", "/api/users/{user}", "Create or update a user", tag=USERS, body="UserBody", codes=(*CHANGED, 400))
async def _put_user(c: Call) -> Any:
    return created(await users.put_user_off_loop(c.node, c.principal, c.params["user"], c.body))


@route("DELETE", "/api/users/{user}", "Delete a user (closes its connections)", tag=USERS, codes=(204, 404))
async def _delete_user(c: Call) -> Any:
    await users.delete_user(c.agent, c.node, c.principal, c.params["user"])
    return NO_CONTENT


@route("GET", "/api/users/{user}/permissions", "A user's permissions", tag=USERS, reply="Permission[]",
       listing=True, codes=(404,))
def _user_permissions(c: Call) -> Any:
    return _list(c, users.user_permissions(c.node, c.principal, c.params["user"]), PERMISSION_SORT)


@route("GET", "/api/users/{user}/topic-permissions", "A user's topic permissions", tag=USERS,
       reply="TopicPermission[]", listing=True, codes=(404,))
def _user_topic_permissions(c: Call) -> Any:
    found = users.list_topic_permissions(c.node, c.principal, user=c.params["user"])
    return _list(c, found, TOPIC_PERMISSION_SORT)


# -- vhosts -----------------------------------------------------------------------------------------


@route("GET", "/api/vhosts", "Virtual hosts the caller can see", tag=VHOSTS, reply="Vhost[]", listing=True)
async def _vhosts(c: Call) -> Any:
    return _list(c, await users.list_vhosts(c.agent, c.node, c.principal, c.stats), NAME_SORT)


@route("GET", "/api/vhosts/{vhost}", "One virtual host", tag=VHOSTS, reply="Vhost", codes=(404,))
async def _vhost(c: Call) -> Any:
    return _one(c, await users.get_vhost(c.agent, c.node, c.principal, c.params["vhost"], c.stats))


@route("PUT", "/api/vhosts/{vhost}", "Create or update a virtual host", tag=VHOSTS, body="VhostBody",
       codes=(*CHANGED, 400))
def _put_vhost(c: Call) -> Any:
    return created(users.put_vhost(c.node, c.principal, c.params["vhost"], c.body))


@route("DELETE", "/api/vhosts/{vhost}", "Delete a virtual host", tag=VHOSTS, codes=(204, 404))
def _delete_vhost(c: Call) -> Any:
    users.delete_vhost(c.node, c.principal, c.params["vhost"])
    return NO_CONTENT


@route("GET", "/api/vhosts/{vhost}/permissions", "A virtual host's permissions", tag=VHOSTS,
       reply="Permission[]", listing=True, codes=(404,))
def _vhost_permissions(c: Call) -> Any:
    return _list(c, users.vhost_permissions(c.node, c.principal, c.params["vhost"]), PERMISSION_SORT)


@route("GET", "/api/vhosts/{vhost}/topic-permissions", "A virtual host's topic permissions", tag=VHOSTS,
       reply="TopicPermission[]", listing=True, codes=(404,))
def _vhost_topic_permissions(c: Call) -> Any:
    found = users.list_topic_permissions(c.node, c.principal, vhost=c.params["vhost"])
    return _list(c, found, TOPIC_PERMISSION_SORT)


@route("GET", "/api/vhosts/{vhost}/connections", "Connections to a virtual host", tag=VHOSTS,
       reply="Connection[]", listing=True, codes=(404,))
async def _vhost_connections(c: Call) -> Any:
    return _list(c, await clients.list_connections(c.agent, c.node, c.principal, c.params["vhost"], c.stats))


@route("GET", "/api/vhosts/{vhost}/channels", "Channels in a virtual host", tag=VHOSTS, reply="Channel[]",
       listing=True, codes=(404,))
async def _vhost_channels(c: Call) -> Any:
    return _list(c, await clients.list_channels(c.agent, c.node, c.principal, c.params["vhost"], c.stats))


# -- permissions ------------------------------------------------------------------------------------


@route("GET", "/api/permissions", "Every permission (administrators)", tag=PERMISSIONS, reply="Permission[]",
       listing=True)
def _permissions(c: Call) -> Any:
    return _list(c, users.list_permissions(c.node, c.principal), PERMISSION_SORT)


@route("GET", "/api/permissions/{vhost}/{user}", "A user's permission on a virtual host", tag=PERMISSIONS,
       reply="Permission", codes=(404,))
def _permission(c: Call) -> Any:
    return users.get_permission(c.node, c.principal, c.params["vhost"], c.params["user"])


@route("PUT", "/api/permissions/{vhost}/{user}", "Set a user's permission on a virtual host", tag=PERMISSIONS,
       body="PermissionBody", codes=(*CHANGED, 400))
def _put_permission(c: Call) -> Any:
    return created(users.put_permission(c.node, c.principal, c.params["vhost"], c.params["user"], c.body))


@route("DELETE", "/api/permissions/{vhost}/{user}", "Clear a user's permission on a virtual host",
       tag=PERMISSIONS, codes=(204, 404))
def _delete_permission(c: Call) -> Any:
    users.delete_permission(c.node, c.principal, c.params["vhost"], c.params["user"])
    return NO_CONTENT


@route("GET", "/api/topic-permissions", "Every topic permission (administrators)", tag=PERMISSIONS,
       reply="TopicPermission[]", listing=True)
def _topic_permissions(c: Call) -> Any:
    return _list(c, users.list_topic_permissions(c.node, c.principal), TOPIC_PERMISSION_SORT)


@route("GET", "/api/topic-permissions/{vhost}/{user}", "A user's topic permissions on a virtual host",
       tag=PERMISSIONS, reply="TopicPermission[]", codes=(404,))
def _topic_permission(c: Call) -> Any:
    return users.get_topic_permission(c.node, c.principal, c.params["vhost"], c.params["user"])


@route("PUT", "/api/topic-permissions/{vhost}/{user}", "Set a user's topic permission for one exchange",
       tag=PERMISSIONS, body="TopicPermissionBody", codes=(*CHANGED, 400))
def _put_topic_permission(c: Call) -> Any:
    return created(users.put_topic_permission(c.node, c.principal, c.params["vhost"], c.params["user"], c.body))


@route("DELETE", "/api/topic-permissions/{vhost}/{user}", "Clear a user's topic permissions on a virtual host",
       tag=PERMISSIONS, codes=(204, 404))
def _delete_topic_permission(c: Call) -> Any:
    users.delete_topic_permission(c.node, c.principal, c.params["vhost"], c.params["user"])
    return NO_CONTENT


@route("GET", "/api/topic-permissions/{vhost}/{user}/{exchange}", "A user's topic permission for one exchange",
       tag=PERMISSIONS, reply="TopicPermission[]", codes=(404,))
def _topic_permission_exchange(c: Call) -> Any:
    p = c.params
    return users.get_topic_permission(c.node, c.principal, p["vhost"], p["user"], p["exchange"])


@route("DELETE", "/api/topic-permissions/{vhost}/{user}/{exchange}",
       "Clear a user's topic permission for one exchange", tag=PERMISSIONS, codes=(204, 404))
def _delete_topic_permission_exchange(c: Call) -> Any:
    p = c.params
    users.delete_topic_permission(c.node, c.principal, p["vhost"], p["user"], p["exchange"])
    return NO_CONTENT


# -- queues -----------------------------------------------------------------------------------------


@route("GET", "/api/queues", "Queues the caller can see", tag=QUEUES, reply="Queue[]", listing=True)
async def _queues(c: Call) -> Any:
    return await topology.queue_list(c.agent, c.node, c.principal, None, c.query, c.stats)


async def _exchange_list(c: Call, vhost: str | None) -> Any:
    exchanges = topology.exchange_objects(c.node, c.principal, vhost)
    held = await topology.delayed_held(c.agent, c.node, exchanges)

    def full(x: Any) -> dict[str, Any]:
        return formats.exchange_json(x, c.stats, held)

    return listing.paged_reply(exchanges, c.query, topology.exchange_light, full)


@route("GET", "/api/queues/{vhost}", "Queues of a virtual host", tag=QUEUES, reply="Queue[]", listing=True,
       codes=(404,))
async def _vhost_queues(c: Call) -> Any:
    return await topology.queue_list(c.agent, c.node, c.principal, c.params["vhost"], c.query, c.stats)


@route("GET", "/api/queues/{vhost}/{name}", "One queue, with its consumers", tag=QUEUES, reply="Queue",
       codes=(404,))
async def _queue(c: Call) -> Any:
    return _one(c, await topology.get_queue(c.agent, c.node, c.principal, c.params["vhost"], c.params["name"],
                                            c.stats))


@route("PUT", "/api/queues/{vhost}/{name}", "Declare a queue", tag=QUEUES, body="QueueBody",
       codes=(*CHANGED, 400, 404))
def _put_queue(c: Call) -> Any:
    return created(topology.put_queue(c.node, c.principal, c.params["vhost"], c.params["name"], c.body))


@route("DELETE", "/api/queues/{vhost}/{name}", "Delete a queue (?if-unused=true, ?if-empty=true)", tag=QUEUES,
       codes=(204, 400, 404))
async def _delete_queue(c: Call) -> Any:
    await topology.delete_queue(c.agent, c.node, c.principal, c.params["vhost"], c.params["name"],
                                if_unused=c.flag("if-unused"), if_empty=c.flag("if-empty"))
    return NO_CONTENT


@route("DELETE", "/api/queues/{vhost}/{name}/contents", "Purge a queue", tag=QUEUES, codes=(204, 404))
async def _purge_queue(c: Call) -> Any:
    await topology.purge_queue(c.agent, c.node, c.principal, c.params["vhost"], c.params["name"])
    return NO_CONTENT


@route("GET", "/api/queues/{vhost}/{name}/bindings", "Bindings to a queue", tag=QUEUES, reply="Binding[]",
       listing=True, codes=(404,))
def _queue_bindings(c: Call) -> Any:
    return _list(c, topology.queue_bindings(c.node, c.principal, c.params["vhost"], c.params["name"]), BINDING_SORT)


@route("POST", "/api/queues/{vhost}/{name}/get", "Get messages from a queue (and settle them per ackmode)",
       tag=QUEUES, body="GetBody", reply="Message[]", codes=(400, 404))
async def _queue_get(c: Call) -> Any:
    return await messages.get_messages(c.node, c.principal, c.params["vhost"], c.params["name"], c.body)


# -- exchanges --------------------------------------------------------------------------------------


@route("GET", "/api/exchanges", "Exchanges the caller can see", tag=EXCHANGES, reply="Exchange[]", listing=True)
async def _exchanges(c: Call) -> Any:
    return await _exchange_list(c, None)


@route("GET", "/api/exchanges/{vhost}", "Exchanges of a virtual host", tag=EXCHANGES, reply="Exchange[]",
       listing=True, codes=(404,))
async def _vhost_exchanges(c: Call) -> Any:
    return await _exchange_list(c, c.params["vhost"])


@route("GET", "/api/exchanges/{vhost}/{name}", "One exchange (the default exchange is amq.default)",
       tag=EXCHANGES, reply="Exchange", codes=(404,))
async def _exchange(c: Call) -> Any:
    return _one(c, await topology.get_exchange(c.agent, c.node, c.principal, c.params["vhost"], c.params["name"],
                                               c.stats))


@route("PUT", "/api/exchanges/{vhost}/{name}", "Declare an exchange", tag=EXCHANGES, body="ExchangeBody",
       codes=(*CHANGED, 400, 404))
def _put_exchange(c: Call) -> Any:
    return created(topology.put_exchange(c.node, c.principal, c.params["vhost"], c.params["name"], c.body))


@route("DELETE", "/api/exchanges/{vhost}/{name}", "Delete an exchange (?if-unused=true)", tag=EXCHANGES,
       codes=(204, 400, 404))
def _delete_exchange(c: Call) -> Any:
    topology.delete_exchange(c.node, c.principal, c.params["vhost"], c.params["name"],
                             if_unused=c.flag("if-unused"))
    return NO_CONTENT


@route("GET", "/api/exchanges/{vhost}/{name}/bindings/source", "Bindings from an exchange", tag=EXCHANGES,
       reply="Binding[]", listing=True, codes=(404,))
def _exchange_bindings_source(c: Call) -> Any:
    found = topology.exchange_bindings(c.node, c.principal, c.params["vhost"], c.params["name"], "source")
    return _list(c, found, BINDING_SORT)


@route("GET", "/api/exchanges/{vhost}/{name}/bindings/destination", "Bindings to an exchange", tag=EXCHANGES,
       reply="Binding[]", listing=True, codes=(404,))
def _exchange_bindings_destination(c: Call) -> Any:
    found = topology.exchange_bindings(c.node, c.principal, c.params["vhost"], c.params["name"], "destination")
    return _list(c, found, BINDING_SORT)


@route("POST", "/api/exchanges/{vhost}/{name}/publish", "Publish a message (as mandatory): {\"routed\": bool}",
       tag=EXCHANGES, body="PublishBody", reply="Routed", codes=(400, 404))
async def _exchange_publish(c: Call) -> Any:
    return await messages.publish(c.node, c.principal, c.params["vhost"], c.params["name"], c.body)


# -- bindings ---------------------------------------------------------------------------------------


@route("GET", "/api/bindings", "Bindings the caller can see", tag=BINDINGS, reply="Binding[]", listing=True)
def _bindings(c: Call) -> Any:
    return _list(c, topology.list_bindings(c.node, c.principal), BINDING_SORT)


@route("GET", "/api/bindings/{vhost}", "Bindings of a virtual host", tag=BINDINGS, reply="Binding[]",
       listing=True, codes=(404,))
def _vhost_bindings(c: Call) -> Any:
    return _list(c, topology.list_bindings(c.node, c.principal, c.params["vhost"]), BINDING_SORT)


def _binding_routes(dtype: str, kind: str) -> None:
    """GET/POST .../e/{source}/{dtype}/{destination} and GET/DELETE .../{props} for one destination type."""
    base = f"/api/bindings/{{vhost}}/e/{{source}}/{dtype}/{{destination}}"

    def list_between(c: Call) -> Any:
        p = c.params
        found = topology.bindings_between(c.node, c.principal, p["vhost"], p["source"], dtype, p["destination"])
        return _list(c, found, BINDING_SORT)

    def create(c: Call) -> Any:
        p = c.params
        key = topology.create_binding(c.node, c.principal, p["vhost"], p["source"], dtype, p["destination"],
                                      c.body)
        return Status(201, {"Location": topology.binding_location(p["destination"], key)})

    def get_one(c: Call) -> Any:
        p = c.params
        return _one(c, topology.get_binding(c.node, c.principal, p["vhost"], p["source"], dtype, p["destination"],
                                            p["props"]))

    def delete_one(c: Call) -> Any:
        p = c.params
        topology.delete_binding(c.node, c.principal, p["vhost"], p["source"], dtype, p["destination"], p["props"])
        return NO_CONTENT

    for method, path, fn, summary, extra in (
            ("GET", base, list_between, f"Bindings from an exchange to a {kind}",
             {"reply": "Binding[]", "listing": True, "codes": (404,)}),
            ("POST", base, create, f"Bind an exchange to a {kind}: 201 with the new binding's Location",
             {"body": "BindingBody", "codes": (201, 400, 404)}),
            ("GET", base + "/{props}", get_one, f"One binding to a {kind}, by its properties_key",
             {"reply": "Binding", "codes": (404,)}),
            ("DELETE", base + "/{props}", delete_one, f"Delete one binding to a {kind}, by its properties_key",
             {"codes": (204, 404)})):
        fn.__name__ = f"_{method.lower()}_binding_{kind}_{fn.__name__}"
        route(method, path, summary, tag=BINDINGS, **extra)(fn)


_binding_routes("q", "queue")
_binding_routes("e", "exchange")


# -- policies and operator policies -----------------------------------------------------------------


def _policy_routes(prefix: str, operator: bool) -> None:
    """GET list (all, one vhost) and GET/PUT/DELETE one, under /api/policies or /api/operator-policies."""
    kind = "operator_policy" if operator else "policy"
    what = "operator policies" if operator else "policies"

    def list_all(c: Call) -> Any:
        return _list(c, policies.list_policies(c.node, c.principal, None, operator), POLICY_SORT)

    def list_vhost(c: Call) -> Any:
        return _list(c, policies.list_policies(c.node, c.principal, c.params["vhost"], operator), POLICY_SORT)

    def get_one(c: Call) -> Any:
        return _one(c, policies.get_policy(c.node, c.principal, c.params["vhost"], c.params["name"], operator))

    def put_one(c: Call) -> Any:
        return created(policies.put_policy(c.node, c.principal, c.params["vhost"], c.params["name"], c.body,
                                           operator))

    def delete_one(c: Call) -> Any:
        policies.delete_policy(c.node, c.principal, c.params["vhost"], c.params["name"], operator)
        return NO_CONTENT

    one = prefix + "/{vhost}/{name}"
    for method, path, fn, summary, extra in (
            ("GET", prefix, list_all, f"Every vhost's {what}", {"reply": "Policy[]", "listing": True}),
            ("GET", prefix + "/{vhost}", list_vhost, f"A virtual host's {what}",
             {"reply": "Policy[]", "listing": True, "codes": (404,)}),
            ("GET", one, get_one, f"One of the {what}", {"reply": "Policy", "codes": (404,)}),
            ("PUT", one, put_one, f"Set one of the {what}", {"body": "PolicyBody", "codes": (*CHANGED, 400, 404)}),
            ("DELETE", one, delete_one, f"Clear one of the {what}", {"codes": (204, 404)})):
        fn.__name__ = f"_{method.lower()}_{kind}_{fn.__name__}"
        route(method, path, summary, tag=POLICIES, **extra)(fn)


_policy_routes("/api/policies", operator=False)
_policy_routes("/api/operator-policies", operator=True)


# -- connections, channels, consumers ---------------------------------------------------------------


@route("GET", "/api/connections", "Connections the caller can see", tag=CLIENTS, reply="Connection[]",
       listing=True)
async def _connections(c: Call) -> Any:
    return _list(c, await clients.list_connections(c.agent, c.node, c.principal, None, c.stats))


@route("GET", "/api/connections/username/{username}", "A user's connections", tag=CLIENTS,
       reply="Connection[]", listing=True)
async def _user_connections(c: Call) -> Any:
    return _list(c, await clients.user_connections(c.agent, c.principal, c.params["username"], c.stats, node=c.node))


@route("DELETE", "/api/connections/username/{username}", "Close a user's connections", tag=CLIENTS,
       codes=(204,))
async def _close_user_connections(c: Call) -> Any:
    await clients.close_user_connections(c.agent, c.principal, c.params["username"], c.headers.get("X-Reason"),
                                         node=c.node)
    return NO_CONTENT


@route("GET", "/api/connections/{name}", "One connection", tag=CLIENTS, reply="Connection", codes=(404,))
async def _connection(c: Call) -> Any:
    return _one(c, await clients.get_connection(c.agent, c.principal, c.params["name"], c.stats, node=c.node))


@route("DELETE", "/api/connections/{name}", "Close a connection (reason in the X-Reason header)", tag=CLIENTS,
       codes=(204, 404))
async def _close_connection(c: Call) -> Any:
    await clients.close_connection(c.agent, c.principal, c.params["name"], c.headers.get("X-Reason"), node=c.node)
    return NO_CONTENT


@route("GET", "/api/connections/{name}/channels", "A connection's channels", tag=CLIENTS, reply="Channel[]",
       listing=True, codes=(404,))
async def _connection_channels(c: Call) -> Any:
    return _list(c, await clients.connection_channels(c.agent, c.principal, c.params["name"], c.stats, node=c.node))


@route("GET", "/api/channels", "Channels the caller can see", tag=CLIENTS, reply="Channel[]", listing=True)
async def _channels(c: Call) -> Any:
    return _list(c, await clients.list_channels(c.agent, c.node, c.principal, None, c.stats))


@route("GET", "/api/channels/{channel}", "One channel, with its consumers and publishes per exchange",
       tag=CLIENTS, reply="Channel", codes=(404,))
async def _channel(c: Call) -> Any:
    return _one(c, await clients.get_channel(c.agent, c.principal, c.params["channel"], c.stats))


@route("GET", "/api/consumers", "Consumers in the virtual hosts the caller can see", tag=CLIENTS,
       reply="Consumer[]", listing=True)
async def _consumers(c: Call) -> Any:
    return _list(c, await clients.list_consumers(c.agent, c.node, c.principal), CONSUMER_SORT)


@route("GET", "/api/consumers/{vhost}", "Consumers of a virtual host", tag=CLIENTS, reply="Consumer[]",
       listing=True, codes=(404,))
async def _vhost_consumers(c: Call) -> Any:
    return _list(c, await clients.list_consumers(c.agent, c.node, c.principal, c.params["vhost"]), CONSUMER_SORT)


__all__ = ["BINDING_SORT", "CONSUMER_SORT", "POLICY_SORT"]
