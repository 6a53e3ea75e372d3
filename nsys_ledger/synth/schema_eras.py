"""Older Nsight Systems export layouts (2021.3 - 2025.5) as `SchemaEra`s the generator can write.

    >>> from nsys_ledger.synth import generate
    >>> generate("/tmp/old.sqlite", steps=2, nsys_version="2022")   # or era=era_for_version("2022.2")

What changes between eras, besides column lists (each `SchemaEra` field says which era has what):

- 2021.3 (before 2021.4): no `mangledName` in the kernel table, kernels and graphs launched through
  the driver API (`cuLaunchKernel`, `cuGraphLaunch`, eventClass 1), no version table at all,
  `TARGET_INFO_CUDA_GPU` instead of `TARGET_INFO_GPU`, no ENUM_* tables.
- 2022.2: `EXPORT_META_DATA`, no ENUM_* tables, CUDA backtraces on: every runtime call has an
  `eventClass = 67` duplicate row (same correlationId, unversioned name, a `callchainId`).
- 2023.1 - 2023.3: the node table is `CUDA_GRAPH_EVENTS(graphNodeId, originalGraphNodeId)` and
  there is no table for graph-level events; `EXPORT_META_DATA` up to 2023.2, `META_DATA_EXPORT` and
  `META_DATA_CAPTURE` from 2023.3; ENUM_* tables from 2023.1.
- 2024.6, 2025.5 (and 2026.2 in nsys_schema.py): `CUDA_GRAPH_NODE_EVENTS`, `greenContextId` (2024.5),
  `graphId` and cluster columns on kernels and `copyCount` on copies (2025.5).

Where each CREATE TABLE comes from (`SchemaEra.provenance` records it per table):
- copied verbatim from `sqlite_master` of the real export of that era in /work/shared/real_traces/
  (2022.2 pipit, 2023.1 memfusion, 2024.6 llama3, 2025.5 flameox; 2026.2 nsys-ai in nsys_schema.py);
- a table an era's export does not hold (lazy exports skip empty tables) comes from the nearest
  real export that has it, minus the columns the schema reference says came later
  (2024.6 MEMCPY is 2025.5's without `copyCount`; the 2023.x node table is 2022.2's);
- 2021.3 is the 2022.2 layout without the columns the schema reference says early 2021 lacked.
  `TARGET_INFO_CUDA_GPU` exists in no export at hand: it is reconstructed from CUPTI's device
  record (CUpti_ActivityDevice) and the columns public report scripts query on it (`deviceId`,
  `name`, `numMultiprocessors`, `numThreadsPerWarp`, `maxWarpsPerMultiprocessor`,
  `computeCapabilityMajor`, `coreClockRate`, `maxIPC`).
- ENUM_* tables (2023.1+) use the 2026.2 statements and rows: the labels the importer needs are
  stable and it carries them itself.
Version strings of 2023.2 and 2023.3 (no export at hand) are the release only ("2023.2"), and their
schema version is that of the 2023.1 layout they are written in (3.1.2).
"""

from __future__ import annotations

import re

from nsys_ledger.synth.nsys_schema import (
    DDL_ENUM_NSYS_2026_2,
    DDL_FROM_SCHEMA_DOC,
    DDL_NSYS_2025_5,
    ENUM_ROWS_NSYS_2026_2,
    ERA_2026_2,
    SchemaEra,
)

__all__ = ["ERAS_BY_VERSION", "NSYS_VERSIONS", "era_for_version"]

# Copied verbatim from sqlite_master of hpcgroup__pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite
# (nsys 2022.2.1.31, schema 2.9.1, exported with --lazy=false), except that the file's RUNTIME and
# MEMCPY tables end in a `name TEXT` column that pipit appends (ALTER TABLE) when it reads a file;
# nsys does not write it, so it is left out. StringIds, PROCESSES, ANALYSIS_DETAILS and
# TARGET_INFO_GPU of that file are identical to the 2026.2/2025.5 statements and are not repeated.
DDL_NSYS_2022_2: dict[str, str] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER   REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId), -- ID used to identify the API call that launched the event.
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    demangledName               INTEGER   NOT NULL,                    -- StringId of the kernel name
    shortName                   INTEGER   NOT NULL,                    -- StringId of the short function name without arguments.
    mangledName                 INTEGER,                               -- StringId of the mangled function name.
    launchType                  INTEGER,                               -- Launch type of the kernel. See docs for specifics.
    cacheConfig                 INTEGER,                               -- Cache configuration used for the kernel. See enum CUfunc_cache.
    registersPerThread          INTEGER   NOT NULL,                    -- Number of registers required for each thread executing the kernel.
    gridX                       INTEGER   NOT NULL,                    -- X-dimension grid size.
    gridY                       INTEGER   NOT NULL,                    -- Y-dimension grid size.
    gridZ                       INTEGER   NOT NULL,                    -- Z-dimension grid size.
    blockX                      INTEGER   NOT NULL,                    -- X-dimension block size.
    blockY                      INTEGER   NOT NULL,                    -- Y-dimension block size.
    blockZ                      INTEGER   NOT NULL,                    -- Z-dimension block size.
    staticSharedMemory          INTEGER   NOT NULL,                    -- Static shared memory allocated for the kernel (B).
    dynamicSharedMemory         INTEGER   NOT NULL,                    -- Dynamic shared memory reserved for the kernel (B).
    localMemoryPerThread        INTEGER   NOT NULL,                    -- Amount of local memory reserved for each thread (B).
    localMemoryTotal            INTEGER   NOT NULL,                    -- Total amount of local memory reserved for the kernel (B).
    gridId                      INTEGER   NOT NULL,                    -- Unique grid ID of the kernel assigned at runtime.
    sharedMemoryExecuted        INTEGER,                               -- Shared memory size set by the driver.
    graphNodeId                 INTEGER   REFERENCES CUDA_GRAPH_EVENTS(graphNodeId), -- CUDA graph node creation ID.
    sharedMemoryLimitConfig     INTEGER                                -- Shared memory limit per block config. See enum CUpti_FuncShmemLimitConfig.
)""",
    "CUPTI_ACTIVITY_KIND_RUNTIME": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    eventClass                  INTEGER   NOT NULL,                    -- CUDA event class enum value. See docs for specifics.
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    correlationId               INTEGER,                               -- ID used to identify events that this function call has triggered.
    nameId                      INTEGER   NOT NULL   REFERENCES StringIds(id), -- StringId of the function name.
    returnValue                 INTEGER   NOT NULL,                    -- Return value of the function call.
    callchainId                 INTEGER   REFERENCES CUDA_CALLCHAINS(id) -- ID of the attached callchain.
)""",
    "CUPTI_ACTIVITY_KIND_MEMCPY": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER   REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId), -- ID used to identify the API call that launched the event.
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    bytes                       INTEGER   NOT NULL,                    -- Number of bytes transferred (B).
    copyKind                    INTEGER   NOT NULL,                    -- Type of the memory copy. See enum CUDA_MEMCPY_KIND.
    deprecatedSrcId             INTEGER,                               -- Deprecated, use srcDeviceId instead.
    srcKind                     INTEGER,                               -- Source memory kind See enum CUDA_MEMOPR_MEMORY_KIND.
    dstKind                     INTEGER,                               -- Destination memory kind. See enum CUDA_MEMOPR_MEMORY_KIND.
    srcDeviceId                 INTEGER,                               -- Source device ID.
    srcContextId                INTEGER,                               -- Source context ID.
    dstDeviceId                 INTEGER,                               -- Destination device ID.
    dstContextId                INTEGER,                               -- Destination context ID.
    migrationCause              INTEGER,                               -- UVM migration cause ID. See CUpti_ActivityUnifiedMemoryMigrationCause.
    graphNodeId                 INTEGER   REFERENCES CUDA_GRAPH_EVENTS(graphNodeId), -- CUDA graph node creation ID.
    virtualAddress              INTEGER                                -- Virtual base address of the page/s being transferred.
)""",
    "CUPTI_ACTIVITY_KIND_MEMSET": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER   REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId), -- ID used to identify the API call that launched the event.
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    value                       INTEGER   NOT NULL,                    -- Value assigned to memory.
    bytes                       INTEGER   NOT NULL,                    -- Number of bytes set (B).
    graphNodeId                 INTEGER   REFERENCES CUDA_GRAPH_EVENTS(graphNodeId), -- CUDA graph node creation ID.
    memKind                     INTEGER                                -- Type of memory being set. See enum CUDA_MEMOPR_MEMORY_KIND.
)""",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- Correlation ID of the synchronization API to which this result is associated.
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    syncType                    INTEGER   NOT NULL,                    -- Type of synchronization. See enum CUpti_ActivitySynchronizationType.
    eventId                     INTEGER   NOT NULL                     -- Event ID for which the synchronization API is called.
)""",
    "NVTX_EVENTS": """\
CREATE TABLE NVTX_EVENTS (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER,                               -- Event end timestamp (ns).
    eventType                   INTEGER   NOT NULL,                    -- NVTX event type enum value. See docs for specifics.
    rangeId                     INTEGER,                               -- Correlation ID returned from a nvtxRangeStart call.
    category                    INTEGER,                               -- User-controlled ID that can be used to group events.
    color                       INTEGER,                               -- Encoded ARGB color value.
    text                        TEXT,                                  -- Optional text message for non registered strings.
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    endGlobalTid                INTEGER,                               -- Serialized GlobalId. See docs for specifics.
    textId                      INTEGER   REFERENCES StringIds(id),    -- StringId of the NVTX domain registered string.
    domainId                    INTEGER,                               -- User-controlled ID that can be used to group events.
    uint64Value                 INTEGER,                               -- One of possible payload value union members.
    int64Value                  INTEGER,                               -- One of possible payload value union members.
    doubleValue                 REAL,                                  -- One of possible payload value union members.
    uint32Value                 INTEGER,                               -- One of possible payload value union members.
    int32Value                  INTEGER,                               -- One of possible payload value union members.
    floatValue                  REAL,                                  -- One of possible payload value union members.
    jsonTextId                  INTEGER,                               -- One of possible payload value union members.
    jsonText                    TEXT                                   -- One of possible payload value union members.
)""",
    "ThreadNames": """\
CREATE TABLE ThreadNames (
    nameId                      INTEGER   NOT NULL   REFERENCES StringIds(id), -- StringId of the thread name.
    priority                    INTEGER,                               -- Priority of the thread.
    globalTid                   INTEGER                                -- Serialized GlobalId.
)""",
    "TARGET_INFO_CUDA_STREAM": """\
CREATE TABLE TARGET_INFO_CUDA_STREAM (
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    hwId                        INTEGER   NOT NULL,                    -- Hardware ID.
    vmId                        INTEGER   NOT NULL,                    -- VM ID.
    processId                   INTEGER   NOT NULL,                    -- Process ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    priority                    INTEGER   NOT NULL,                    -- Priority of the stream.
    flag                        INTEGER   NOT NULL                     -- Flags for stream creation.
)""",
    "PROFILER_OVERHEAD": """\
CREATE TABLE PROFILER_OVERHEAD (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    nameId                      INTEGER   NOT NULL   REFERENCES StringIds(id), -- StringId of the function name.
    returnValue                 INTEGER   NOT NULL                     -- Return value of the function call.
)""",
    "TARGET_INFO_SESSION_START_TIME": """\
CREATE TABLE TARGET_INFO_SESSION_START_TIME (
    utcEpochNs                  INTEGER,                               -- UTC Epoch timestamp at start of the capture (ns).
    utcTime                     TEXT,                                  -- Start of the capture in UTC.
    localTime                   TEXT                                   -- Start of the capture in local time of target.
)""",
    "CUDA_GRAPH_EVENTS": """\
CREATE TABLE CUDA_GRAPH_EVENTS (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    eventClass                  INTEGER   NOT NULL,                    -- CUDA event class enum value. See docs for specifics.
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    nameId                      INTEGER   NOT NULL   REFERENCES StringIds(id), -- StringId of the function name.
    graphNodeId                 INTEGER   NOT NULL   REFERENCES CUDA_GRAPH_EVENTS(graphNodeId), -- CUDA graph node creation ID.
    originalGraphNodeId         INTEGER                                -- Reference to the original graph node ID, if cloned node.
)""",
    "EXPORT_META_DATA": """\
CREATE TABLE EXPORT_META_DATA (
    -- information about nsys export process

    name                        TEXT      NOT NULL,                    -- Name of export meta-data record
    value                       TEXT                                   -- Value of export meta-data record
)""",
    "CUDA_CALLCHAINS": """\
CREATE TABLE CUDA_CALLCHAINS (
    id                          INTEGER   NOT NULL,                    -- Part of PRIMARY KEY (id, stackDepth).
    symbol                      INTEGER   NOT NULL   REFERENCES StringIds(id), -- StringId of the function name.
    module                      INTEGER   NOT NULL   REFERENCES StringIds(id), -- StringId of the module name.
    unresolved                  INTEGER,                               -- True if the symbol was not resolved.
    originalIP                  INTEGER,                               -- Instruction pointer value.
    stackDepth                  INTEGER   NOT NULL,                    -- Zero-base index of the given function in call stack.

    PRIMARY KEY (id, stackDepth)
)""",
}


# Copied verbatim from sqlite_master of LeiWang1999__memfusion_artifact__report1.sqlite
# (nsys 2023.1.2.43, schema 3.1.2): the tables whose statements differ from 2026.2. Its
# StringIds, RUNTIME, PROCESSES, ThreadNames, TARGET_INFO_CUDA_STREAM, ANALYSIS_DETAILS and
# TARGET_INFO_GPU are identical to the 2026.2/2025.5 statements.
DDL_NSYS_2023_1: dict[str, str] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    demangledName               INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Kernel function name w/ templates
    shortName                   INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Base kernel function name
    mangledName                 INTEGER,                               -- REFERENCES StringIds(id) -- Raw C++ mangled kernel function name
    launchType                  INTEGER,                               -- REFERENCES ENUM_CUDA_KRENEL_LAUNCH_TYPE(id)
    cacheConfig                 INTEGER,                               -- REFERENCES ENUM_CUDA_FUNC_CACHE_CONFIG(id)
    registersPerThread          INTEGER   NOT NULL,                    -- Number of registers required for each thread executing the kernel.
    gridX                       INTEGER   NOT NULL,                    -- X-dimension grid size.
    gridY                       INTEGER   NOT NULL,                    -- Y-dimension grid size.
    gridZ                       INTEGER   NOT NULL,                    -- Z-dimension grid size.
    blockX                      INTEGER   NOT NULL,                    -- X-dimension block size.
    blockY                      INTEGER   NOT NULL,                    -- Y-dimension block size.
    blockZ                      INTEGER   NOT NULL,                    -- Z-dimension block size.
    staticSharedMemory          INTEGER   NOT NULL,                    -- Static shared memory allocated for the kernel (B).
    dynamicSharedMemory         INTEGER   NOT NULL,                    -- Dynamic shared memory reserved for the kernel (B).
    localMemoryPerThread        INTEGER   NOT NULL,                    -- Amount of local memory reserved for each thread (B).
    localMemoryTotal            INTEGER   NOT NULL,                    -- Total amount of local memory reserved for the kernel (B).
    gridId                      INTEGER   NOT NULL,                    -- Unique grid ID of the kernel assigned at runtime.
    sharedMemoryExecuted        INTEGER,                               -- Shared memory size set by the driver.
    graphNodeId                 INTEGER,                               -- REFERENCES CUDA_GRAPH_EVENTS(graphNodeId)
    sharedMemoryLimitConfig     INTEGER                                -- REFERENCES ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG(id)
)""",
    "CUPTI_ACTIVITY_KIND_MEMCPY": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    bytes                       INTEGER   NOT NULL,                    -- Number of bytes transferred (B).
    copyKind                    INTEGER   NOT NULL,                    -- REFERENCES ENUM_CUDA_MEMCPY_OPER(id)
    deprecatedSrcId             INTEGER,                               -- Deprecated, use srcDeviceId instead.
    srcKind                     INTEGER,                               -- REFERENCES ENUM_CUDA_MEM_KIND(id)
    dstKind                     INTEGER,                               -- REFERENCES ENUM_CUDA_MEM_KIND(id)
    srcDeviceId                 INTEGER,                               -- Source device ID.
    srcContextId                INTEGER,                               -- Source context ID.
    dstDeviceId                 INTEGER,                               -- Destination device ID.
    dstContextId                INTEGER,                               -- Destination context ID.
    migrationCause              INTEGER,                               -- REFERENCES ENUM_CUDA_UNIF_MEM_MIGRATION(id)
    graphNodeId                 INTEGER,                               -- REFERENCES CUDA_GRAPH_EVENTS(graphNodeId)
    virtualAddress              INTEGER                                -- Virtual base address of the page/s being transferred.
)""",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- Correlation ID of the synchronization API to which this result is associated.
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    syncType                    INTEGER   NOT NULL,                    -- REFERENCES ENUM_CUPTI_SYNC_TYPE(id)
    eventId                     INTEGER   NOT NULL                     -- Event ID for which the synchronization API is called.
)""",
    "NVTX_EVENTS": """\
CREATE TABLE NVTX_EVENTS (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER,                               -- Event end timestamp (ns).
    eventType                   INTEGER   NOT NULL,                    -- REFERENCES ENUM_NSYS_EVENT_TYPE(id)
    rangeId                     INTEGER,                               -- Correlation ID returned from a nvtxRangeStart call.
    category                    INTEGER,                               -- User-controlled ID that can be used to group events.
    color                       INTEGER,                               -- Encoded ARGB color value.
    text                        TEXT,                                  -- Optional text message for non registered strings.
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    endGlobalTid                INTEGER,                               -- Serialized GlobalId.
    textId                      INTEGER,                               -- REFERENCES StringIds(id) -- Registered NVTX domain
    domainId                    INTEGER,                               -- User-controlled ID that can be used to group events.
    uint64Value                 INTEGER,                               -- One of possible payload value union members.
    int64Value                  INTEGER,                               -- One of possible payload value union members.
    doubleValue                 REAL,                                  -- One of possible payload value union members.
    uint32Value                 INTEGER,                               -- One of possible payload value union members.
    int32Value                  INTEGER,                               -- One of possible payload value union members.
    floatValue                  REAL,                                  -- One of possible payload value union members.
    jsonTextId                  INTEGER,                               -- One of possible payload value union members.
    jsonText                    TEXT                                   -- One of possible payload value union members.
)""",
    "PROFILER_OVERHEAD": """\
CREATE TABLE PROFILER_OVERHEAD (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    nameId                      INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Function name
    returnValue                 INTEGER   NOT NULL                     -- Return value of the function call.
)""",
    "TARGET_INFO_SESSION_START_TIME": """\
CREATE TABLE TARGET_INFO_SESSION_START_TIME (
    utcEpochNs                  INTEGER,                               -- UTC Epoch timestamp at start of the capture (ns).
    utcTime                     TEXT,                                  -- Start of the capture in UTC.
    localTime                   TEXT                                   -- Start of the capture in local time of target.
)""",
    "EXPORT_META_DATA": """\
CREATE TABLE EXPORT_META_DATA (
    -- information about nsys export process

    name                        TEXT      NOT NULL,                    -- Name of export meta-data record
    value                       TEXT                                   -- Value of export meta-data record
)""",
}


# Copied verbatim from sqlite_master of Sh1mwww__llama3-inference__real_inference_simulation.sqlite
# (nsys 2024.6.2, schema 3.16.1): the tables whose statements differ from 2026.2. Its StringIds,
# RUNTIME, MEMSET, NVTX_EVENTS, META_DATA_EXPORT, META_DATA_CAPTURE, PROCESSES, ThreadNames,
# TARGET_INFO_CUDA_STREAM, ANALYSIS_DETAILS, TARGET_INFO_GPU and TARGET_INFO_CUDA_CONTEXT_INFO are
# identical to the 2026.2/2025.5 statements. The file has no MEMCPY table (lazy export).
DDL_NSYS_2024_6: dict[str, str] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    greenContextId              INTEGER,                               -- Green context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    demangledName               INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Kernel function name w/ templates
    shortName                   INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Base kernel function name
    mangledName                 INTEGER,                               -- REFERENCES StringIds(id) -- Raw C++ mangled kernel function name
    launchType                  INTEGER,                               -- REFERENCES ENUM_CUDA_KERNEL_LAUNCH_TYPE(id)
    cacheConfig                 INTEGER,                               -- REFERENCES ENUM_CUDA_FUNC_CACHE_CONFIG(id)
    registersPerThread          INTEGER   NOT NULL,                    -- Number of registers required for each thread executing the kernel.
    gridX                       INTEGER   NOT NULL,                    -- X-dimension grid size.
    gridY                       INTEGER   NOT NULL,                    -- Y-dimension grid size.
    gridZ                       INTEGER   NOT NULL,                    -- Z-dimension grid size.
    blockX                      INTEGER   NOT NULL,                    -- X-dimension block size.
    blockY                      INTEGER   NOT NULL,                    -- Y-dimension block size.
    blockZ                      INTEGER   NOT NULL,                    -- Z-dimension block size.
    staticSharedMemory          INTEGER   NOT NULL,                    -- Static shared memory allocated for the kernel (B).
    dynamicSharedMemory         INTEGER   NOT NULL,                    -- Dynamic shared memory reserved for the kernel (B).
    localMemoryPerThread        INTEGER   NOT NULL,                    -- Amount of local memory reserved for each thread (B).
    localMemoryTotal            INTEGER   NOT NULL,                    -- Total amount of local memory reserved for the kernel (B).
    gridId                      INTEGER   NOT NULL,                    -- Unique grid ID of the kernel assigned at runtime.
    sharedMemoryExecuted        INTEGER,                               -- Shared memory size set by the driver.
    graphNodeId                 INTEGER,                               -- REFERENCES CUDA_GRAPH_NODE_EVENTS(graphNodeId)
    sharedMemoryLimitConfig     INTEGER                                -- REFERENCES ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG(id)
)""",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    greenContextId              INTEGER,                               -- Green context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- Correlation ID of the synchronization API to which this result is associated.
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    syncType                    INTEGER   NOT NULL,                    -- REFERENCES ENUM_CUPTI_SYNC_TYPE(id)
    eventId                     INTEGER   NOT NULL                     -- Event ID for which the synchronization API is called.
)""",
    "PROFILER_OVERHEAD": """\
CREATE TABLE PROFILER_OVERHEAD (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    nameId                      INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Function name
    returnValue                 INTEGER   NOT NULL                     -- Return value of the function call.
)""",
    "TARGET_INFO_SESSION_START_TIME": """\
CREATE TABLE TARGET_INFO_SESSION_START_TIME (
    utcEpochNs                  INTEGER,                               -- UTC Epoch timestamp at start of the capture (ns).
    utcTime                     TEXT,                                  -- Start of the capture in UTC.
    localTime                   TEXT                                   -- Start of the capture in local time of target.
)""",
}


# Copied verbatim from sqlite_master of morluto__flameox__nsight-2025.5.2.sqlite (nsys 2025.5.2.266,
# schema 3.24.0): the tables it holds whose statements differ from 2026.2 (the others it holds are
# identical, and nsys_schema.DDL_NSYS_2025_5 has those 2026.2 lacks).
DDL_NSYS_2025_5_OWN: dict[str, str] = {
    "CUPTI_ACTIVITY_KIND_KERNEL": """\
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    greenContextId              INTEGER,                               -- Green context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    demangledName               INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Kernel function name w/ templates
    shortName                   INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Base kernel function name
    mangledName                 INTEGER,                               -- REFERENCES StringIds(id) -- Raw C++ mangled kernel function name
    launchType                  INTEGER,                               -- REFERENCES ENUM_CUDA_KERNEL_LAUNCH_TYPE(id)
    cacheConfig                 INTEGER,                               -- REFERENCES ENUM_CUDA_FUNC_CACHE_CONFIG(id)
    registersPerThread          INTEGER   NOT NULL,                    -- Number of registers required for each thread executing the kernel.
    gridX                       INTEGER   NOT NULL,                    -- X-dimension grid size.
    gridY                       INTEGER   NOT NULL,                    -- Y-dimension grid size.
    gridZ                       INTEGER   NOT NULL,                    -- Z-dimension grid size.
    blockX                      INTEGER   NOT NULL,                    -- X-dimension block size.
    blockY                      INTEGER   NOT NULL,                    -- Y-dimension block size.
    blockZ                      INTEGER   NOT NULL,                    -- Z-dimension block size.
    staticSharedMemory          INTEGER   NOT NULL,                    -- Static shared memory allocated for the kernel (B).
    dynamicSharedMemory         INTEGER   NOT NULL,                    -- Dynamic shared memory reserved for the kernel (B).
    localMemoryPerThread        INTEGER   NOT NULL,                    -- Amount of local memory reserved for each thread (B).
    localMemoryTotal            INTEGER   NOT NULL,                    -- Total amount of local memory reserved for the kernel (B).
    gridId                      INTEGER   NOT NULL,                    -- Unique grid ID of the kernel assigned at runtime.
    sharedMemoryExecuted        INTEGER,                               -- Shared memory size set by the driver.
    graphNodeId                 INTEGER,                               -- REFERENCES CUDA_GRAPH_NODE_EVENTS(graphNodeId)
    sharedMemoryLimitConfig     INTEGER,                               -- REFERENCES ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG(id)
    qmdBulkReleaseDone          INTEGER,                               -- QMD bulk release done timestamp from CWD events.
    qmdPreexitDone              INTEGER,                               -- QMD pre-exit done timestamp from CWD events.
    qmdLastCtaDone              INTEGER,                               -- QMD last CTA done timestamp from CWD events.
    graphId                     INTEGER,                               -- Kernel graph ID.
    clusterX                    INTEGER,                               -- Cluster X dimension.
    clusterY                    INTEGER,                               -- Cluster Y dimension.
    clusterZ                    INTEGER,                               -- Cluster Z dimension.
    clusterSchedulingPolicy     INTEGER,                               -- Cluster scheduling policy.
    maxPotentialClusterSize     INTEGER,                               -- Maximum potential cluster size.
    maxActiveClusters           INTEGER                                -- Maximum active clusters.
)""",
    "TARGET_INFO_SESSION_START_TIME": """\
CREATE TABLE TARGET_INFO_SESSION_START_TIME (
    utcEpochNs                  INTEGER,                               -- UTC Epoch timestamp at start of the capture (ns).
    utcTime                     TEXT,                                  -- Start of the capture in UTC.
    localTime                   TEXT                                   -- Start of the capture in local time of target.
)""",
}

# Reconstructed (no 2021 export at hand): see the module docstring.
DDL_RECONSTRUCTED_2021: dict[str, str] = {
    "TARGET_INFO_CUDA_GPU": """\
CREATE TABLE TARGET_INFO_CUDA_GPU (
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    name                        TEXT,                                  -- Device name.
    uuid                        TEXT,                                  -- Device UUID.
    computeCapabilityMajor      INTEGER,                               -- Major compute capability version number.
    computeCapabilityMinor      INTEGER,                               -- Minor compute capability version number.
    numMultiprocessors          INTEGER,                               -- Number of multiprocessors on the device.
    numThreadsPerWarp           INTEGER,                               -- Warp size in threads.
    maxWarpsPerMultiprocessor   INTEGER,                               -- Maximum number of warps per multiprocessor.
    maxBlocksPerMultiprocessor  INTEGER,                               -- Maximum number of blocks per multiprocessor.
    maxThreadsPerBlock          INTEGER,                               -- Maximum number of threads per block.
    maxRegistersPerBlock        INTEGER,                               -- Maximum number of 32-bit registers available per block.
    maxSharedMemoryPerBlock     INTEGER,                               -- Maximum shared memory available per block (B).
    globalMemorySize            INTEGER,                               -- Total amount of memory on the device (B).
    globalMemoryBandwidth       INTEGER,                               -- Memory bandwidth (KB/s).
    l2CacheSize                 INTEGER,                               -- Size of L2 cache (B).
    coreClockRate               INTEGER,                               -- Core clock frequency (kHz).
    maxIPC                      INTEGER                                -- Maximum instructions per cycle.
)""",
}

_PIPIT = "hpcgroup__pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
_MEMFUSION = "LeiWang1999__memfusion_artifact__report1.sqlite"
_LLAMA3 = "Sh1mwww__llama3-inference__real_inference_simulation.sqlite"
_FLAMEOX = "morluto__flameox__nsight-2025.5.2.sqlite"
_NSYS_AI = "GindaChen__nsys-ai__h100_2gpu_1s.sqlite"
_DOC = "nsys-sqlite-schema.md"


def _without_columns(sql: str, *columns: str) -> str:
    """`sql` without the lines of `columns`: columns an older nsys did not write yet."""
    lines = sql.split("\n")
    for column in columns:
        index = next(i for i, line in enumerate(lines) if line.split()[:1] == [column])
        del lines[index]
        if lines[index].startswith(")"):  # it was the last column: the one before loses its comma
            lines[index - 1] = re.sub(r",(?=\s*(?:--|$))", " ", lines[index - 1], count=1)
    return "\n".join(lines)


def _same_as_2026(*tables: str) -> dict[str, str]:
    """Statements an older export holds word for word as the 2026.2/2025.5 ones."""
    return {table: ERA_2026_2.ddl[table] for table in tables}


def _assemble(*sources: tuple[str, dict[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    """table -> DDL and table -> source; the first source that names a table wins."""
    ddl: dict[str, str] = {}
    provenance: dict[str, str] = {}
    for source, tables in sources:
        for name, sql in tables.items():
            ddl.setdefault(name, sql)
            provenance.setdefault(name, source)
    return ddl, provenance


_NODE_TABLE_2022 = {"CUDA_GRAPH_EVENTS": DDL_NSYS_2022_2["CUDA_GRAPH_EVENTS"]}
_CORE_2022 = {name: sql for name, sql in DDL_NSYS_2022_2.items()
              if name not in ("EXPORT_META_DATA", "CUDA_CALLCHAINS")}


def _era_2021_3() -> SchemaEra:
    kernel = DDL_NSYS_2022_2["CUPTI_ACTIVITY_KIND_KERNEL"]
    ddl, provenance = _assemble(
        (f"{_PIPIT} without mangledName ({_DOC}: early 2021)",
         {"CUPTI_ACTIVITY_KIND_KERNEL": _without_columns(kernel, "mangledName")}),
        (f"{_PIPIT} (2022.2 layout)", _CORE_2022),
        (f"{_PIPIT} (identical to 2026.2)", _same_as_2026("StringIds", "PROCESSES", "ANALYSIS_DETAILS")),
        ("reconstructed (CUPTI device record, public report scripts)", DDL_RECONSTRUCTED_2021),
    )
    return SchemaEra(
        name="nsys-2021.3", product_version="2021.3", product_date="2021.3", schema_version="",
        ddl=ddl, provenance=provenance, version_table=None, graph_node_table="CUDA_GRAPH_EVENTS",
        graph_event_table=None, gpu_table="TARGET_INFO_CUDA_GPU", driver_launches=True,
    )


def _era_2022_2() -> SchemaEra:
    ddl, provenance = _assemble(
        (_PIPIT, DDL_NSYS_2022_2),
        (f"{_PIPIT} (identical to 2026.2)",
         _same_as_2026("StringIds", "PROCESSES", "ANALYSIS_DETAILS", "TARGET_INFO_GPU")),
    )
    return SchemaEra(
        name="nsys-2022.2", product_version="2022.2.1.31", product_date="2022.2", schema_version="2.9.1",
        ddl=ddl, provenance=provenance, version_table="EXPORT_META_DATA",
        graph_node_table="CUDA_GRAPH_EVENTS", graph_event_table=None, backtrace_rows=True,
    )


def _layout_2023(*extra: tuple[str, dict[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    return _assemble(
        *extra,
        (_MEMFUSION, DDL_NSYS_2023_1),
        (f"{_MEMFUSION} (identical to 2026.2)",
         _same_as_2026("StringIds", "CUPTI_ACTIVITY_KIND_RUNTIME", "PROCESSES", "ThreadNames",
                       "TARGET_INFO_CUDA_STREAM", "ANALYSIS_DETAILS", "TARGET_INFO_GPU")),
        (f"{_PIPIT} (node table of nsys <= 2023.3)", _NODE_TABLE_2022),
        (f"{_NSYS_AI} (ENUM tables, from 2023.1)", DDL_ENUM_NSYS_2026_2),
    )


def _era_2023(release: str) -> SchemaEra:
    extra = []
    if release == "2023.3":
        extra.append((f"{_LLAMA3} (identical to 2026.2; META_DATA_* from 2023.3)",
                      _same_as_2026("META_DATA_EXPORT", "META_DATA_CAPTURE")))
    ddl, provenance = _layout_2023(*extra)
    real = release == "2023.1"
    return SchemaEra(
        name=f"nsys-{release}", product_version="2023.1.2.43" if real else release,
        product_date=release, schema_version="3.1.2", ddl=ddl, enum_rows=ENUM_ROWS_NSYS_2026_2,
        graph_mode_keys=("PROCESS_0:CUDA_GRAPH_TRACE_OPTIONS:MODE",), provenance=provenance,
        version_table="META_DATA_EXPORT" if release == "2023.3" else "EXPORT_META_DATA",
        graph_node_table="CUDA_GRAPH_EVENTS", graph_event_table=None,
    )


def _era_2024_6() -> SchemaEra:
    memcpy = ERA_2026_2.ddl["CUPTI_ACTIVITY_KIND_MEMCPY"]  # == 2025.5's
    ddl, provenance = _assemble(
        (_LLAMA3, DDL_NSYS_2024_6),
        (f"{_LLAMA3} (identical to 2026.2)",
         _same_as_2026("StringIds", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMSET",
                       "NVTX_EVENTS", "META_DATA_EXPORT", "META_DATA_CAPTURE", "PROCESSES",
                       "ThreadNames", "TARGET_INFO_CUDA_STREAM", "ANALYSIS_DETAILS", "TARGET_INFO_GPU",
                       "TARGET_INFO_CUDA_CONTEXT_INFO")),
        (f"{_FLAMEOX} without copyCount ({_DOC}: from 2025.5)",
         {"CUPTI_ACTIVITY_KIND_MEMCPY": _without_columns(memcpy, "copyCount")}),
        (_FLAMEOX, DDL_NSYS_2025_5),
        (_DOC, DDL_FROM_SCHEMA_DOC),
        (f"{_NSYS_AI} (ENUM tables)", DDL_ENUM_NSYS_2026_2),
    )
    return SchemaEra(
        name="nsys-2024.6", product_version="2024.6.2.225", product_date="2024.6", schema_version="3.16.1",
        ddl=ddl, enum_rows=ENUM_ROWS_NSYS_2026_2,
        graph_mode_keys=("PROCESS_0:CUDA_GRAPH_TRACE_OPTIONS:MODE",), provenance=provenance,
    )


def _era_2025_5() -> SchemaEra:
    ddl, provenance = _assemble(
        (_FLAMEOX, DDL_NSYS_2025_5_OWN),
        (_FLAMEOX, DDL_NSYS_2025_5),
        (f"{_NSYS_AI} (identical in {_FLAMEOX} where it holds the table)", ERA_2026_2.ddl),
    )
    return SchemaEra(
        name="nsys-2025.5", product_version="2025.5.2.266", product_date="2025.5", schema_version="3.24.0",
        ddl=ddl, enum_rows=ENUM_ROWS_NSYS_2026_2,
        graph_mode_keys=("PROCESS_0:CUDA_GRAPH_TRACE_OPTIONS:MODE",), provenance=provenance,
    )


ERA_2021_3 = _era_2021_3()
ERA_2022_2 = _era_2022_2()
ERA_2023_1 = _era_2023("2023.1")
ERA_2023_2 = _era_2023("2023.2")
ERA_2023_3 = _era_2023("2023.3")
ERA_2024_6 = _era_2024_6()
ERA_2025_5 = _era_2025_5()

ERAS_BY_VERSION: dict[str, SchemaEra] = {
    "2021.3": ERA_2021_3, "2022.2": ERA_2022_2, "2023.1": ERA_2023_1, "2023.2": ERA_2023_2,
    "2023.3": ERA_2023_3, "2024.6": ERA_2024_6, "2025.5": ERA_2025_5, "2026.2": ERA_2026_2,
}
# A year alone names its one layout; 2023 had three.
_YEARS = {"2021": "2021.3", "2022": "2022.2", "2024": "2024.6", "2025": "2025.5", "2026": "2026.2"}
NSYS_VERSIONS: tuple[str, ...] = tuple(ERAS_BY_VERSION) + tuple(_YEARS)


def era_for_version(version: str) -> SchemaEra:
    """The layout nsys `version` writes: "2022", "2023.3", "2024.6.2.225", ..."""
    text = str(version).strip()
    release = _YEARS.get(text) or ".".join(text.split(".")[:2])
    era = ERAS_BY_VERSION.get(release)
    if era is not None:
        return era
    if text == "2023":
        raise ValueError("nsys 2023 wrote three layouts: give 2023.1, 2023.2 or 2023.3")
    raise ValueError(f"no export layout for nsys {version!r}; known: {', '.join(NSYS_VERSIONS)}")
