"""The general download center: download tasks whose rows come from their caller's own source
(``source_url`` or ``source_data``), not from a crawl; each is an export with a project and its
parameters instead of a job, run by the one export protocol.

- ``params``: a download task's parameters checked into ``DownloadTaskParams`` (the typed record
  of its stored ``center`` document, ``common/store/records.py``);
- ``service``: deliver, get, list, delete, and the synchronous download, through the export
  service's public functions;
- ``v1``: the /v1 dialect (the interface of linvanda/download that existing callers use): its
  parameters, download task ids, status numbers and answers;
- ``callers``: the calling systems of /v1, their signatures and their own project ids;
- ``cli``: ``downcluster center`` and ``downcluster caller``.

The web's doors are ``master/web/routes/center.py`` (/api/v1/center) and ``v1.py`` (/v1).
"""
