CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS WITH RECURSIVE r(start, "end", deviceId, demangledName) AS
  (SELECT 0, 1, 0, 1 UNION ALL SELECT start + 1, "end" + 1, deviceId, demangledName FROM r) SELECT * FROM r;
