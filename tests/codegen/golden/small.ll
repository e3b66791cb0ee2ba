; ModuleID = "small"
target triple = "unknown-unknown-unknown"
target datalayout = ""

define void @"small"(ptr %".1", ptr %".2", ptr %".3", i32 %".4")
{
entry:
  %".6" = alloca <4 x float>
  %".7" = alloca <4 x float>
  %".8" = icmp slt i64 0, 3
  br i1 %".8", label %"i.body", label %"i.done"
i.body:
  %"i" = phi  i64 [0, %"entry"], [%".65", %"i.body"]
  store <4 x float> <float              0x0, float              0x0, float              0x0, float              0x0>, ptr %".6"
  store <4 x float> <float              0x0, float              0x0, float              0x0, float              0x0>, ptr %".7"
  %".12" = mul nsw i64 %"i", 2
  %".13" = getelementptr inbounds float, ptr %".2", i64 0
  %".14" = load <4 x float>, ptr %".13", align 4
  %".15" = getelementptr inbounds float, ptr %".1", i64 %".12"
  %".16" = load float, ptr %".15", align 4
  %".17" = insertelement <4 x float> <float undef, float undef, float undef, float undef>, float %".16", i32 0
  %".18" = shufflevector <4 x float> %".17", <4 x float> <float undef, float undef, float undef, float undef>, <4 x i32> <i32 0, i32 0, i32 0, i32 0>
  %".19" = load <4 x float>, ptr %".6"
  %".20" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".18", <4 x float> %".14", <4 x float> %".19")
  store <4 x float> %".20", ptr %".6"
  %".22" = add nsw i64 %".12", 1
  %".23" = getelementptr inbounds float, ptr %".1", i64 %".22"
  %".24" = load float, ptr %".23", align 4
  %".25" = insertelement <4 x float> <float undef, float undef, float undef, float undef>, float %".24", i32 0
  %".26" = shufflevector <4 x float> %".25", <4 x float> <float undef, float undef, float undef, float undef>, <4 x i32> <i32 0, i32 0, i32 0, i32 0>
  %".27" = load <4 x float>, ptr %".7"
  %".28" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".26", <4 x float> %".14", <4 x float> %".27")
  store <4 x float> %".28", ptr %".7"
  %".30" = mul nsw i64 %"i", 2
  %".31" = add nsw i64 %".30", 6
  %".32" = getelementptr inbounds float, ptr %".2", i64 4
  %".33" = load <4 x float>, ptr %".32", align 4
  %".34" = getelementptr inbounds float, ptr %".1", i64 %".31"
  %".35" = load float, ptr %".34", align 4
  %".36" = insertelement <4 x float> <float undef, float undef, float undef, float undef>, float %".35", i32 0
  %".37" = shufflevector <4 x float> %".36", <4 x float> <float undef, float undef, float undef, float undef>, <4 x i32> <i32 0, i32 0, i32 0, i32 0>
  %".38" = load <4 x float>, ptr %".6"
  %".39" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".37", <4 x float> %".33", <4 x float> %".38")
  store <4 x float> %".39", ptr %".6"
  %".41" = add nsw i64 %".31", 1
  %".42" = getelementptr inbounds float, ptr %".1", i64 %".41"
  %".43" = load float, ptr %".42", align 4
  %".44" = insertelement <4 x float> <float undef, float undef, float undef, float undef>, float %".43", i32 0
  %".45" = shufflevector <4 x float> %".44", <4 x float> <float undef, float undef, float undef, float undef>, <4 x i32> <i32 0, i32 0, i32 0, i32 0>
  %".46" = load <4 x float>, ptr %".7"
  %".47" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".45", <4 x float> %".33", <4 x float> %".46")
  store <4 x float> %".47", ptr %".7"
  %".49" = mul nsw i64 %"i", 8
  %".50" = load <4 x float>, ptr %".6"
  %".51" = fsub <4 x float> <float              0x0, float              0x0, float              0x0, float              0x0>, %".50"
  %".52" = call <4 x float> @"llvm.exp.v4f32"(<4 x float> %".51")
  %".53" = fadd <4 x float> <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>, %".52"
  %".54" = fdiv <4 x float> <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>, %".53"
  %".55" = getelementptr inbounds float, ptr %".3", i64 %".49"
  store <4 x float> %".54", ptr %".55", align 4
  %".57" = load <4 x float>, ptr %".7"
  %".58" = fsub <4 x float> <float              0x0, float              0x0, float              0x0, float              0x0>, %".57"
  %".59" = call <4 x float> @"llvm.exp.v4f32"(<4 x float> %".58")
  %".60" = fadd <4 x float> <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>, %".59"
  %".61" = fdiv <4 x float> <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>, %".60"
  %".62" = add nsw i64 %".49", 4
  %".63" = getelementptr inbounds float, ptr %".3", i64 %".62"
  store <4 x float> %".61", ptr %".63", align 4
  %".65" = add nsw nuw i64 %"i", 1
  %".66" = icmp slt i64 %".65", 3
  br i1 %".66", label %"i.body", label %"i.done"
i.done:
  ret void
}

declare <4 x float> @"llvm.fma.v4f32"(<4 x float> %".1", <4 x float> %".2", <4 x float> %".3")

declare <4 x float> @"llvm.exp.v4f32"(<4 x float> %".1")
