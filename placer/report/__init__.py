"""Reports: facts about a profile, a plan and a run, as HTML, Markdown or JSON."""
