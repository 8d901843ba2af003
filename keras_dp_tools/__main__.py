"""``python -m keras_dp_tools``: the same as the ``keras-dp`` command."""

import sys

from keras_dp_tools.tools.cli import main

sys.exit(main())
