"""setup.cfg holds the metadata; this adds one build step: a copy of the docs' pages and
of the report notebook inside the package (keras_dp_tools/_shipped/), so that a pip
user has what ``keras-dp docs`` and ``keras-dp notebook`` read (keras_dp_tools/tools/
shipped.py). An editable install and a checkout read docs/ and notebooks/ themselves."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithDocs(build_py):
    """build_py, then docs/*.md and notebooks/report.ipynb into keras_dp_tools/_shipped/."""

    def run(self):
        super().run()
        if self.editable_mode:  # the checkout's own files are read in place
            return
        shipped = Path(self.build_lib) / "keras_dp_tools" / "_shipped"
        (shipped / "docs").mkdir(parents=True, exist_ok=True)
        for page in sorted((ROOT / "docs").glob("*.md")):
            shutil.copyfile(page, shipped / "docs" / page.name)
        # docs/changelog.md only includes CHANGELOG.md when the site is built.
        shutil.copyfile(ROOT / "CHANGELOG.md", shipped / "docs" / "changelog.md")
        shutil.copyfile(ROOT / "notebooks" / "report.ipynb", shipped / "report.ipynb")


setup(cmdclass={"build_py": BuildWithDocs})
