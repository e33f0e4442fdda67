"""Which sbatch/srun words would rename the job (launch/slurm/options.py ``renames_job``): getopt's
bundles and long-option prefixes included, so no spelling slips past the -J refusal. Pure, no daemons."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_jupyter.launch.slurm.options import SlurmOptionsError, refuse_job_name, renames_job

NO_ARG = "HhOQsuVvWlXZE"


@pytest.mark.parametrize("word", ["-J", "-Jx", "-vJmyname", "-HJx", "-QJx", "-vvvJx", "--job-name=x", "--job-name",
                                  "--job=x", "--jo=x", "--j=x", "--job-n", "-OJ"])
def test_words_that_set_the_name(word):
    assert renames_job(word)


@pytest.mark.parametrize("word", ["-pJobs", "-tJ", "-vpJ", "--jobid=3", "--", "-", "J", "--time=5", "-v", "x-J",
                                  "--partition=Jx", "-kJx", "-aJ"])
def test_words_that_do_not(word):
    assert not renames_job(word)


def test_the_refusal_names_the_item_of_a_bundle():
    with pytest.raises(SlurmOptionsError, match=r"--slurm-arg '--time=5 -vJmyname'.*Drop -J/--job-name"):
        refuse_job_name(["--time=5 -vJmyname"])


@given(st.text(alphabet=NO_ARG, max_size=6), st.text(max_size=8))
def test_any_bundle_of_flags_reaching_J_renames(flags, rest):
    assert renames_job(f"-{flags}J{rest}")


@given(st.text(alphabet=NO_ARG, max_size=4), st.sampled_from("pAtNnwxCcDdeoiq"), st.text(max_size=8))
def test_after_a_letter_that_takes_an_argument_the_rest_is_its_value(flags, takes_arg, rest):
    assert not renames_job(f"-{flags}{takes_arg}{rest}")
