"""What the layers of dynemb share, below the tables: the enums and element types
(``types``), the table options (``table_options``), score strategies' names and checks
(``score_strategies``) and dtype converters (``dtypes``). DynamicEmb's module paths
re-export them."""
