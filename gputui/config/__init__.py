"""Profiles: the schema and every profile table, each declared once.

One module per table (`run`, `hosts`, `cloud`, `cluster`, `sweep`, `alerts`, `ui`): a frozen
dataclass whose fields carry their schema (`schema.key`), and the `Section` generated from it
(`schema.section_of`), so a key, its type, its bounds, its default and its documentation are
written once. `config.profile` is the registry: the tables a profile may hold, `parse_profile`,
`load_profile` and `Profile`. The table modules never import the registry (nor anything above
the ground floor): what needs a loaded profile (`load_cloud_settings`, `cluster_settings`,
`load_spec`, ...) lives with the feature that uses it and imports the registry from above.

This package's `__init__` imports nothing, so importing one table module loads that table only.
"""
