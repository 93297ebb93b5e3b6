"""The inference gateway: the global inference server's gRPC face of a Conduit cluster.

``BlockInferenceService.infer`` (the wire in ``gateway/proto/inference.proto``) takes a task
for a block, checks the caller's bearer token, parses the packet into a :class:`gateway.task.Task`
and hands it to an :class:`gateway.executor.Executor`; ``grpc.health.v1`` is served beside it.
``conduit gateway`` runs it. It may import core, protocol, tracker, lane and director, never the
api or the CLI.
"""
