import grpc
import time
import inference_pb2
import inference_pb2_grpc
import os

# gRPC Channel to connect with the server
SERVER_ADDRESS = os.environ["SERVER_ADDRESS"]

def create_inference_request():
    request = inference_pb2.BlockInferencePacket(
        block_id="blk-weugwtns",  # Fixed block ID
        session_id="sess-12345",  # Unique session ID
        seq_no=1,  # First message in the sequence
        data='''{
            "messages": [
                {"role": "system", "content": "You are a helpful AI assistant."},
                {"role": "user", "content": "How does photosynthesis work?"},
                {"role": "assistant", "content": "Photosynthesis is the process plants use to convert sunlight into energy."},
                {"role": "user", "content": "Can you explain it in simpler terms?"}
            ]
        }''',  # Chat messages with history
        ts=time.time(),  # Current UNIX timestamp
        query_parameters="",  # Not needed since block_id is fixed
        output_ptr="",  # No graph inference
        files=[]  # No files attached
    )
    return request

def main():
    """Runs the inference client"""
    # Create a gRPC channel and stub
    channel = grpc.insecure_channel(SERVER_ADDRESS)
    stub = inference_pb2_grpc.BlockInferenceServiceStub(channel)

    # Create and send the request
    request = create_inference_request()
    response = stub.infer(request, metadata=[("authorization", "Bearer " + os.environ["REPLICATE_API_TOKEN"])])

    # Print the response
    print("Inference Response:")
    print("Session ID:", response.session_id)
    print("Sequence No:", response.seq_no)
    print("Data:", response.data)
    print("Timestamp:", response.ts)

if __name__ == "__main__":
    main()
