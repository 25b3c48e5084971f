"""What the layers of dynemb share, below the tables: the enums and element types
(``types``), the table options (``table_options``), score strategies' names and checks
(``score_strategies``), the optimizers (``optimizer``), dtype converters (``dtypes``) and
the ``Storage`` interface of a slow tier (``storage``). DynamicEmb's module paths and
``dynemb.tiering`` re-export them."""
