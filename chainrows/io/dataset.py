"""Deprecated: use chainrows.formats.native.dataset (its ``check_*`` functions are ``validate_*``)."""

from chainrows.io import moved

moved(globals(), "chainrows.formats.native.dataset",
      renamed={"check_schema": "validate_schema", "check_utf8": "validate_utf8",
               "check_offsets": "validate_offsets", "check_list_offsets": "validate_list_offsets"})
