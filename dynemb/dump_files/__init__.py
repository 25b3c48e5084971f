"""The files of a dump: field files and their formats (``format``), the manifest, which
columns a table saves (``columns``), checks of the bytes (``verify``), reading saved rows
(``saved_rows``) and DynamicEmb's file layout (``dynamicemb_layout``). Below the tables:
``dynemb.checkpoint`` writes and reads them for a model, ``dynemb.warm_start`` reads one
table out of them."""
