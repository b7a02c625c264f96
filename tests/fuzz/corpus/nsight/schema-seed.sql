-- The seed export of the nsight fuzz target (tests/fuzz/corpus/nsight/step.sqlite):
--   sqlite3 tests/fuzz/corpus/nsight/step.sqlite < tests/fuzz/nsight_seed.sql

CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, "end" INTEGER NOT NULL, deviceId INTEGER, streamId INTEGER,
  correlationId INTEGER, globalPid INTEGER, demangledName INTEGER, shortName INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, "end" INTEGER NOT NULL, eventClass INTEGER, globalTid INTEGER,
  correlationId INTEGER, nameId INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, "end" INTEGER, eventType INTEGER, rangeId INTEGER, category INTEGER, color INTEGER,
  text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER);
CREATE TABLE ThreadNames (nameId INTEGER, priority INTEGER, globalTid INTEGER);
INSERT INTO StringIds VALUES (1, 'ampere_bf16_s16816gemm_fwd'), (2, 'ampere_bf16_s16816gemm_bwd'), (3, 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL'),
  (4, 'ncclDevKernel_SendRecv'), (5, 'cudaLaunchKernel'), (6, 'pt_autograd_0'), (7, 'python'), (8, 'ProfilerStep#3');
INSERT INTO ThreadNames VALUES (7, 0, 100), (6, 0, 200);
INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (1000, 1100, 0, 100, 11, 5), (5000, 5100, 0, 100, 12, 5), (9000, 9100, 0, 200, 13, 5),
  (12000, 12100, 0, 100, 14, 5), (15000, 15100, 0, 100, 15, 5);
INSERT INTO NVTX_EVENTS VALUES (4900, 5500, 59, 0, 0, 0, 'MmBackward0', 100, 100, NULL), (0, 40000, 59, 0, 0, 0, NULL, 100, 100, 8);
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES
  (2000, 4000, 0, 7, 11, 1, 1, 1), (6000, 9000, 0, 7, 12, 1, 2, 2), (10000, 12000, 0, 7, 13, 1, 2, 2),
  (13000, 14000, 0, 20, 14, 1, 3, 3), (16000, 16500, 0, 21, 15, 1, 4, 4), (2000, 3000, 1, 7, 99, 1, 1, 1);
