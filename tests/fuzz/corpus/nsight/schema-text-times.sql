CREATE TABLE StringIds (id, value);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, "end", deviceId, correlationId, demangledName);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start, "end", globalTid, correlationId);
CREATE TABLE NVTX_EVENTS (start, "end", text, globalTid, textId);
INSERT INTO StringIds VALUES (1, 'gemm'), (1, 'again'), ('x', 'text id'), (2.5, 'real id');
INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1000, 2000, 0, 1, 1), ('3000', 4000.5, 0, 2, 'x'), (NULL, 5, 'dev', NULL, 9);
INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (900, 950, 'tid', 1), ('t', 1, 2, 2);
INSERT INTO NVTX_EVENTS VALUES (0, 9000, NULL, 1, 1), (5, 'x', 'backward', 1, NULL);
