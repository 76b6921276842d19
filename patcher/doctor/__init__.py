"""``modelpatch doctor``: what a model needs on a given engine and GPU, and the recipe that
fixes it. The command and ``--fix``'s applying live in ``patcher.cli.doctor_command``; this
package sits below ``api`` and never imports it or ``cli``."""
