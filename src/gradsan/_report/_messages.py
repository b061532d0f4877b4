"""Every fixed sentence of a report that is not a catalog entry's, as a named constant.

The builder (``_build.py``) fills their slots (``str.format`` fields) from an event's numbers,
names and Frames; backends never write these words themselves. Where the two backends word one
fact differently today, both wordings are here, named by backend (``*_TORCH``, ``*_JAX``), so
the report text stays as it was; unifying them is a change of wording, reviewed on the goldens.
"""

from __future__ import annotations

# ---- origins -----------------------------------------------------------------------------------

# a non-finite input: the values row
INPUT_VALUES_TORCH = "`{name}` ({result} in {count} of {size} elements{first})"
INPUT_FIRST_TORCH = ", first at [{index}]"
INPUT_VALUES_JAX = "{label} holds {got} in {count} of {size} elements{first}"
INPUT_FIRST_JAX = ", first at {index}"

# the clause in parentheses after the headline (events.Note)
NOTE_DERIVATIVE_IS = "its derivative is {value} there"
NOTE_DERIVATIVE_RULE_NAN = "its derivative rule gave nan there"
NOTE_RETURNED = "it returned {value}"
NOTE_CUSTOM_VJP_RULE = "in the custom_vjp backward rule called at {call}"
# the forward value itself is an indeterminate form of finite operands (events.Origin.value_form)
NOTE_VALUE_FORM = "{form}"
NOTE_VALUE_FORM_TOO = "{form} already in the forward pass"
VALUE_FORMS = {"0/0": "0.0 / 0.0 = nan"}

# the headline's clause for the meeting, from the values seen (details.met_clause)
HEAD_MET_ZERO = ", and that {value} met a zero at {zero}"
HEAD_ZERO_OVER_ZERO = ", and a zero from {zero} met a zero divisor: 0.0 / 0.0 = nan"
HEAD_IN_DERIVATIVE = ", and in its derivative {form} at {zero}"
HEAD_OPPOSITE_INF = ", and that {value} met an infinity of the opposite sign at {where}"

# where the inf met a zero
MET_TORCH = "{form} = NaN in {met_op}"
MET_TORCH_VALUES = "{text} in {met_op}"
MET_OP_IN_NODE = "{op} in {node}"  # torch: an aten op and the autograd Node it ran in
MET_JAX = "{text} in the {phase}`{op}`"
MET_JAX_BACKWARD = "backward "
MET_ZERO_HERE = "the zero came from here: "
MET_ZERO_CONSTANT = " (the zero is a constant)"
# what made the zero exact (events.ZeroKind), then ", and " and the form
ZERO_THIS_OPERATION = "this operation"
ZERO_WHERE = "{code} did not select this branch{state}, so its gradient is 0"
ZERO_WHERE_STATE = " (`{cond}` is {value} here)"
ZERO_WHERE_COND = " (condition `{cond}`)"
ZERO_NAN_TO_NUM = (
    "{code} replaced the non-finite value: that fixes the value, not the gradient, and the "
    "replaced element's gradient is 0"
)
ZERO_MASK = "{code} multiplies by a mask{name} that is 0 here, so the gradient through it is 0"
ZERO_INPUT_MASK = (
    "{code} multiplies by {name}, which is 0 here: a mask passed as an argument (not a "
    "constant), so the gradient through it is 0"
)
ZERO_INPUT_MASK_NAME = "the input `{name}`"
ZERO_INPUT_MASK_ANY = "a tensor that requires grad"
ZERO_SLICE = "{code} does not use this element (slicing or indexing drops it), so its gradient is 0"
ZERO_CONSTANT = "the zero is a constant of the program: {code}"
ZERO_INPUT = "the zero is in the input `{name}`"
ZERO_DERIVATIVE = "the derivative of {code} is 0 here"
ZERO_UNDERFLOW = "{code} underflowed to exactly 0"
ZERO_BY_DESIGN = "{code} is exactly 0 by design: exp(-inf) = 0, the weight of a -inf entry"
ZERO_CANCEL = "{code} is a difference of equal values: exactly 0"
ZERO_STOP = "no gradient flows along this path (an integer value or stop_gradient): it is 0"
ZERO_VALUE = "{code} is 0 here"
ZERO_OWN_FORM = "{code} is 0.0 / 0.0 here"  # the zero is the origin's own operand (value_form)
ZERO_AND = "{zero}, and {form}"

# "why" from what was observed, before the entry's own words
WHY_REAL_NEGATIVE = (
    "Here {op} got {got}: a real negative value, far beyond rounding error, so the formula "
    "itself leaves the domain (it is not a value one ulp below 0)."
)
WHY_ROUNDING_NEGATIVE = (
    "Here {op} got {got}: a negative of rounding size, the typical artefact of a difference "
    "that should be >= 0."
)
WHY_ZERO_BY_DESIGN = (
    "Here the 0 that reaches {op} is excluded by design ({what}): the NaN is 0 * inf on an "
    "element the result does not use, not an underflowed probability."
)
WHY_ZERO_OVER_ZERO = (
    "Here {op} got 0.0 / 0.0: both operands are exactly 0, so the value itself is NaN (no "
    "infinity was involved), and its derivative divides by the same 0."
)
# std/var over one element (events.Origin.reduced == 1): its own case, not constant data
NOTE_ONE_ELEMENT = "one element with ddof={ddof}: n - ddof = 0, so 0 / 0 = nan"
TITLE_ONE_ELEMENT = "{op} of a single element: {what}"
TITLE_ONE_ELEMENT_NO_DOF = "n - ddof = 0, the value is 0 / 0 = NaN"
TITLE_ONE_ELEMENT_SQRT = "the derivative of sqrt(0)"
WHY_ONE_ELEMENT_NO_DOF = (
    "Here {op} reduces over a single element with ddof={ddof}: the divisor n - ddof is 1 - "
    "{ddof} = 0, so the variance is 0 / 0 = NaN already in the forward value, and the gradient "
    "is NaN with it. This is not constant data: one element leaves no degree of freedom for "
    "the unbiased estimate. Reduce over more than one element, or use ddof=0 "
    "(torch: correction=0) where a single element can occur."
)
WHY_ONE_ELEMENT_SQRT = (
    "Here {op} reduces over a single element: the mean of one element is that element, so "
    "x - mean is exactly 0 and the variance is 0 for every input; the gradient is the "
    "derivative of sqrt at 0 (inf) times that 0, which is NaN. This is not constant data: the "
    "std of one element is 0 whatever its value, so its true derivative is 0. Reduce over more "
    "than one element, or write sqrt(var + eps)."
)
WHY_ZERO_UNDERFLOW = (
    "Here the zero factor is a value that underflowed to exactly 0 ({what}), not a zero by design."
)

# the indeterminate form itself (jax), from the operand values at the first NaN
FORM_PRODUCT = "{a} * {b} = nan"
FORM_ZERO_OVER_ZERO = "0.0 / 0.0 = nan"
FORM_QUOTIENT = "{a} / {b} = nan"
FORM_SUM = "inf + (-inf) = nan"
FORM_INSIDE = "0 * inf or inf - inf inside {op} = nan"
FORM_OF_INFINITE = "{op} of an infinite input = nan"

# an explanation the builder writes when the catalog has none (events.Because)
SHARD_MAP = (
    "The non-finite value was born inside a shard_map that gradsan ran as one operation: "
    "its body has a collective inside a loop or branch, or mesh axes that are not all manual, "
    "so it was not entered per device. The line shown is the body's first `{op}`; run "
    "gradsan.jax.explain on the body function with one shard's inputs to locate it exactly."
)
CONSTANT_INFS = (
    "`{op}` computed {text} from infinite inputs that came from "
    "constants (such as a -inf mask). Make sure no row or reduction sees only masked "
    "values, or mask the result instead of the input."
)
CONSTANT_INFS_NAN = "a NaN"
NOT_IN_CATALOG = (
    "`{op}` produced {result} from finite inputs. It is not in gradsan's "
    "catalog of singular operations; look at its operand values at the index shown."
)

# report notes
UNSEEN_GRADIENT_TORCH = (
    "the gradient of {names} is non-finite but gradsan did not see the operation that "
    "produced it (was backward run outside the explain block, or under torch.compile?)"
)
REPLAY_STAYED_FINITE = (
    "the compiled function returned a non-finite value, but the replay through "
    "the interpreter stayed finite (XLA fusion can change rounding): run "
    "gradsan.jax.explain on the un-jitted function."
)

# ---- kinks -------------------------------------------------------------------------------------

WHERE_EQUALITY = "a comparison that holds with equality"  # torch: `got` of a where boundary
WHERE_COMPARISON = "lhs {op} rhs with lhs == rhs"
SUBDIFFERENTIAL_JUMP = "none: the function jumps here"
TIE_TRIVIAL = (
    "the tied candidates are the same function of the inputs "
    "(equal tangents along random directions): the gradient is exact"
)

# ---- nansafe -----------------------------------------------------------------------------------

WHY_UNRESOLVED_TORCH = (
    "the zero that met the inf is not structural (it vanishes only at this "
    "point), so 0 * inf has no single value here; gradsan leaves it NaN"
)
WHY_UNRESOLVED_JAX = (
    "the zero that met the inf is not structural (it "
    "vanishes only at this point), so 0 * inf has no single value here; "
    "nansafe leaves it non-finite"
)
RULE_STRUCTURAL_TORCH = (
    "structural zero: 0 * inf := 0 on a path that contributes exactly 0 near this point"
)
REPAIRED_TORCH = "{count} element(s) of the gradient set to exactly 0 at {node}"
RULE_STRUCTURAL = "structural zero: {reasons}"
RULE_STRUCTURAL_ANY = "zero path"
REASON_UNSELECTED = "unselected where branch"
REASON_MARGIN = ", margin {margin:.6g}"
REPAIRED_STRUCTURAL = (
    "{count} element(s) of `{op}` computed 0 * inf (or 0 / 0) with a "
    "structurally zero factor; set to exactly 0, the true gradient (G3)"
)
RULE_STRONG_ZERO = "strong-zero convention"
NOTE_STRONG_ZERO = (
    "0 * inf := 0 applied where the zero is not known to be "
    "structural: a convention, NOT a proven gradient"
)
REPAIRED_STRONG_ZERO = (
    "{count} element(s) of `{op}` set to 0 by the strong-zero convention "
    "(not proven: can be a wrong finite value)"
)
RULE_NUMERICAL = "none: the zero is numerical"
NOTE_NUMERICAL = "deciding it needs the limit engine, gradsan.jax.certify (a later feature)"
STAYED_NAN = "{count} element(s) of `{op}` computed 0 * inf (or 0 / 0) and stayed NaN"
RULE_LIMIT = "limit engine (gradsan.jax.certify): {what}"
LIMIT_GRADIENT = "the gradient"
LIMIT_CLARKE = "a Clarke subgradient"
STRONG_ZERO_MODE = (
    "mode='strong_zero': every 0 * inf (and 0 / 0) in the backward pass was set to 0. "
    "Where the zero was not structural this is a convention, not a proven gradient: "
    "it can be a wrong finite number (sqrt(x) * sqrt(x) at 0 gives 0, the truth is 1)."
)

# ---- certify -----------------------------------------------------------------------------------

CERTIFIED_TITLES = {
    "gradient": "certified gradient (ray limit)",
    "clarke-subgradient": "not differentiable: a Clarke subgradient",
    "singular": "no gradient: singular",
    "undecided": "undecided",
}
CERT_DISCONTINUOUS = (
    "f(x0) is NaN and f(x0 + t v) tends to {lo:.10g} along direction {i} but "
    "to {hi:.10g} along direction {k}: no limit at x0"
)
CERT_RAY = "{verdict}: {certificate}"
CERT_NOT_DIFFERENTIABLE = "; f is not differentiable at x0"
CERT_UNDECIDED = "UNDECIDED: {notes}"
CERT_UNDECIDED_DEFAULT = "the rules could not decide"
CERT_DOMAIN = "DOMAIN: every ray tried leaves the domain of f"
CERT_GRADIENT = (
    "the limit of the gradient along every ray tried is the same: lim_{t->0+} grad f(x0 + t v)"
)
CERT_ONE_SIDED = (
    " (one-sided: {domain} of {total} rays leave the domain, x0 is on the boundary of the domain)"
)
CERT_REMOVABLE = "; f(x0) is NaN but the singularity is removable"
CERT_CLARKE = (
    "not differentiable at x0 ({why}); the minimum-norm element of the convex "
    "hull of the limits is a Clarke subgradient (when f is locally Lipschitz "
    "near x0)"
)
CERT_TWO_LIMITS = "two different limits of the gradient"
CERT_KINK = "f'(x0; v) + f'(x0; -v) != 0"
CERT_DIRECTION = "  direction {direction}: {verdict}"
CERT_DIRECTION_CERTIFICATE = " -- {certificate}"
CERT_DIRECTION_NOTES = " [{notes}]"
UNVERIFIED = "unverified: primitives treated as analytic via repeated JVPs: {ops}"

# ---- the backend's value at a kink (jax/_sanitize.convention; facts of a Kink event) ---------

CONVENTION_JUMP_BLOCKED = (
    "the function jumps here: the gradient through it is blocked (0), which is no subgradient"
)
CONVENTION_ATAN2 = "atan2 is discontinuous at the origin: no value is a subgradient"
CONVENTION_ARGMAX = (
    "an index carries no gradient; gathering at it sends the whole gradient "
    "to one tied element, a vertex of the subdifferential"
)
CONVENTION_WHERE_JUMP = (
    "the branches differ in value on the boundary: the function jumps "
    "there and no gradient is right"
)
CONVENTION_EIGH_VALUE = (
    "a finite gradient for the eigenvalues (v v^T for the basis returned); "
    "nan through the eigenvectors"
)
CONVENTION_EIGH = "admissible for the eigenvalues only; the eigenvectors have none"
CONVENTION_RELU_CUSTOM = "the custom_jvp rule of the enclosing function (jax.nn.relu)"
VALUE_ON_TIED = "[{values}] on the tied elements"
VALUE_ARGMAX = "index {index} (the first of the tied elements)"
VALUE_WHERE = "the derivative of the branch the comparison selected (case {case})"
VALUE_SORT = "the whole gradient to index {got} of the tied {tied}"
VALUE_CLAMP = "d/dx = {value}"

# ---- subgradient's branch (facts of a Kink event) ----------------------------------------------

BRANCH_NOT_LOCKED = "not locked: JAX's convention is kept"
BRANCH_ATAN2 = "atan2 is discontinuous at the origin: no limit gradient exists"
BRANCH_EIGH = (
    "the eigenvalue gradient is a Clarke subgradient, not necessarily the limit along the direction"
)
BRANCH_TIE_CONTINUOUS = (
    "first-order tie: the tied candidates have equal tangents, so "
    "every piece gives the same gradient here"
)
BRANCH_TIE_UNBROKEN = (
    "first-order information cannot tell which side of the "
    "boundary is active: the gradient keeps JAX's convention there "
    "and may not be a limit gradient"
)
BRANCH_ACTIVE = "the piece active along {direction}"
