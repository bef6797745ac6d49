-- The highest fence ever granted per lease name, kept apart from the row so
-- the fence never goes backwards, even if a leases row is deleted by hand
-- (or the leases table is dropped and recreated): a fence compared against,
-- logged, or sent in X-Appview-Fence must only ever grow. Maintained by
-- triggers inside the acquire statement itself; read by the acquire.
CREATE TABLE lease_fence_floor (
  name  TEXT    PRIMARY KEY,
  fence INTEGER NOT NULL
);

INSERT INTO lease_fence_floor (name, fence) SELECT name, fence FROM leases WHERE 1
ON CONFLICT (name) DO UPDATE SET fence = MAX(fence, excluded.fence);

-- The triggers are written as a libSQL server (sqld) stores them, so a file
-- database and a server end with byte-identical schemas.
CREATE TRIGGER leases_fence_floor_insert AFTER INSERT ON leases BEGIN
INSERT INTO lease_fence_floor (name, fence) VALUES (NEW.name, NEW.fence) ON CONFLICT (name) DO UPDATE SET fence = MAX (fence, excluded.fence);
END;

CREATE TRIGGER leases_fence_floor_update AFTER UPDATE OF fence ON leases WHEN NEW.fence <> OLD.fence BEGIN
INSERT INTO lease_fence_floor (name, fence) VALUES (NEW.name, NEW.fence) ON CONFLICT (name) DO UPDATE SET fence = MAX (fence, excluded.fence);
END;
