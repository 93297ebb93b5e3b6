"""The inference gateway: the global inference server's gRPC face of a Conduit cluster.

``BlockInferenceService.infer`` (the wire in ``gateway/proto/inference.proto``) takes a task
for a block, checks the caller's bearer token, parses the packet into a :class:`gateway.task.Task`
and hands it to an :class:`gateway.executor.Executor`; ``grpc.health.v1`` is served beside it.
``conduit gateway`` runs it. Its tasks go through the front door (:mod:`front`) and its routes
(:mod:`gateway.routes`); of the director it uses only the queue client (an import contract),
and it never imports the api or the CLI.
"""
