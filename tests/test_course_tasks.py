"""The course's tasks (docs/course.md): every check passes on its reference solution and fails,
with a message that teaches, on the stub a learner starts from.

    ./test.sh -m course                             # both directions, every task (the suite)
    ./test.sh -m course_2                           # the tasks of step 2
    COURSE_ANSWERS=mine ./test.sh -m course_2       # check YOUR answers (examples/course/exercises)
    COURSE_ANSWERS=mine ./test.sh -m course -k task_2_1    # one task

The checks themselves are in tests/course_tasks.py.
"""

import os
import re

import pytest

from course_tasks import EXERCISES, SOLUTIONS, TASKS, TaskFailed, answers_dir, run_task
from procs import REPO

ANSWERS = os.environ.get("COURSE_ANSWERS", "")
PARAMS = [pytest.param(t, id=t.name, marks=[pytest.mark.course,
                                             getattr(pytest.mark, f"course_{t.step}")])
          for t in TASKS]


if ANSWERS:
    @pytest.mark.parametrize("task", PARAMS)
    def test_my_answer(task):
        failure = None
        try:
            run_task(task, answers_dir(ANSWERS))
        except TaskFailed as e:
            failure = str(e)
        if failure is not None:  # (outside the handler: the lesson alone, no traceback chain)
            pytest.fail(failure, pytrace=False)

else:
    @pytest.mark.parametrize("task", PARAMS)
    def test_solution_passes(task):
        run_task(task, SOLUTIONS)

    @pytest.mark.parametrize("task", PARAMS)
    def test_stub_fails_and_teaches(task):
        try:
            run_task(task, EXERCISES)
        except TaskFailed as e:
            text = str(e)
        else:
            pytest.fail(f"task {task.id}: the stub in examples/course/exercises/step{task.step}.py "
                        "passes its check, and a shipped stub must fail it. Solved it there? "
                        "Check your answers with COURSE_ANSWERS=mine (docs/course.md, 'Tasks'); "
                        "`git diff examples/course/exercises` shows your edits.")
        for part in (f"task {task.id} ", "examples/course/exercises/", "\n  expected: ",
                     "\n  got:      ", "\n  revisit:  step "):
            assert part in text, f"{part!r} missing from the message:\n{text}"


@pytest.mark.course
def test_every_step_has_tasks_and_the_course_lists_each_with_its_command():
    steps = sorted({t.step for t in TASKS})
    assert steps == list(range(1, 8)), steps
    assert len(TASKS) == len({t.id for t in TASKS}) >= 19
    doc = (REPO / "docs" / "course.md").read_text()
    for t in TASKS:
        row = next((line for line in doc.splitlines() if line.startswith(f"| {t.id} ")), None)
        assert row is not None, f"docs/course.md: no table row for task {t.id}"
        assert f"-m course_{t.step} -k {t.name}" in row, row
    markers = (REPO / "pyproject.toml").read_text()
    for marker in ["course"] + [f"course_{s}" for s in steps]:
        assert re.search(rf'"{marker}: ', markers), f"pyproject.toml: marker {marker} missing"


@pytest.mark.course
def test_every_stub_and_solution_defines_the_functions_its_tasks_name():
    for t in TASKS:
        names = re.findall(r"(\w+)\(", t.functions)
        for folder in (EXERCISES, SOLUTIONS):
            text = (folder / f"step{t.step}.py").read_text()
            for name in names:
                assert re.search(rf"^(def {name}\(|{name} = )", text, re.M), (folder, name)


@pytest.mark.course
def test_the_lesson_the_course_quotes_is_what_the_stub_gets():
    doc = (REPO / "docs" / "course.md").read_text()
    quoted = re.search(r"```\n(task 2\.1 .*?)```", doc, re.S)
    assert quoted, "docs/course.md quotes task 2.1's message in a ``` block"
    with pytest.raises(TaskFailed) as info:
        run_task(next(t for t in TASKS if t.id == "2.1"), EXERCISES)
    assert quoted.group(1).strip() == str(info.value).strip()
