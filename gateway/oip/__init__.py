"""The Open Inference Protocol (KServe v2), ``inference.GRPCInferenceService``, on the gateway's
gRPC server: the service, its streams, the models it describes and the tensors it reads and
writes."""
