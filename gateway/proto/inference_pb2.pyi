from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AIOSPacket(_message.Message):
    __slots__ = ("session_id", "seq_no", "data", "ts", "output_ptr", "files")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_NO_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_PTR_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seq_no: int
    data: str
    ts: float
    output_ptr: str
    files: _containers.RepeatedCompositeFieldContainer[FileInfo]
    def __init__(self, session_id: _Optional[str] = ..., seq_no: _Optional[int] = ..., data: _Optional[str] = ..., ts: _Optional[float] = ..., output_ptr: _Optional[str] = ..., files: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ...) -> None: ...

class FileInfo(_message.Message):
    __slots__ = ("metadata", "file_data")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    FILE_DATA_FIELD_NUMBER: _ClassVar[int]
    metadata: str
    file_data: bytes
    def __init__(self, metadata: _Optional[str] = ..., file_data: _Optional[bytes] = ...) -> None: ...

class BlockInferencePacket(_message.Message):
    __slots__ = ("block_id", "session_id", "seq_no", "frame_ptr", "data", "query_parameters", "ts", "files", "output_ptr")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_NO_FIELD_NUMBER: _ClassVar[int]
    FRAME_PTR_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    QUERY_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_PTR_FIELD_NUMBER: _ClassVar[int]
    block_id: str
    session_id: str
    seq_no: int
    frame_ptr: bytes
    data: str
    query_parameters: str
    ts: float
    files: _containers.RepeatedCompositeFieldContainer[FileInfo]
    output_ptr: str
    def __init__(self, block_id: _Optional[str] = ..., session_id: _Optional[str] = ..., seq_no: _Optional[int] = ..., frame_ptr: _Optional[bytes] = ..., data: _Optional[str] = ..., query_parameters: _Optional[str] = ..., ts: _Optional[float] = ..., files: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ..., output_ptr: _Optional[str] = ...) -> None: ...
