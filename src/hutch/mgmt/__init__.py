"""Management: the HTTP API (RabbitMQ-compatible), served next to the AMQP listener.

Layout (see docs/management.md):

* ``http`` - the aiohttp application, authentication, the route table of thin handlers, and
  ``start_management``, the node service plug-in;
* ``users``, ``topology``, ``clients``, ``system`` - the service layer: plain functions over the
  ``Node`` that do the work of each endpoint and raise ``ApiError``;
* ``access`` (tags and permissions), ``listing`` (sort, filter, paginate, columns), ``formats``
  (RabbitMQ's JSON shapes) and ``errors``.

Dependency rule: the service layer never imports aiohttp; ``http`` is the only module that does.
"""

from .http import start_management

__all__ = ["start_management"]
