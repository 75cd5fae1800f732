-- 0007_image_digest: the manifest digest ("sha256:…") of the OCI image a sandbox was created
-- from, pinned at create ('' for the host image). The image cache never collects an image a
-- live sandbox's record names (Store.ImagesInUse).

ALTER TABLE sandboxes ADD COLUMN image_digest TEXT NOT NULL DEFAULT '';

CREATE INDEX sandboxes_image_digest_idx ON sandboxes (image_digest) WHERE image_digest <> '';
